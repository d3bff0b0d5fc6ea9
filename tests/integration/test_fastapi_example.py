"""examples/fastapi_app.py run as a user runs it: ``uvicorn --factory examples.fastapi_app:create_app``
in a subprocess on a free port, on PostgreSQL and Redis, a real worker loading the example's
agent (``THREADS_AGENTS=examples.fastapi_app``), and real HTTP with httpx.

A customer's order and its run commit together and the run streams its reply; a customer of
another company sees neither (404); an order rolled back after it was written starts no run;
bad input gets the API's documented error bodies; staff see the console behind HTTP Basic.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.support.processes import ManagedProcess, WorkerProcess, free_port, subprocess_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

ALICE = {"X-API-Key": "key-alice"}  # acme
BOB = {"X-API-Key": "key-bob"}  # globex
WAIT_S = 60.0


@pytest.fixture(scope="module")
def worker_agents() -> str:
    return "examples.fastapi_app"


@pytest.fixture(scope="module")
def shop(
    worker: WorkerProcess,
    migrated_pg_url: str,
    integration_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The example served by uvicorn in a process of its own; its base URL."""
    port = free_port()
    env = subprocess_env({"THREADS_DATABASE_URL": migrated_pg_url, "THREADS_BROKER_URL": integration_redis_url})
    argv = [sys.executable, "-m", "uvicorn", "--factory", "examples.fastapi_app:create_app"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    process = ManagedProcess("shop", argv, env=env, log_path=tmp_path_factory.mktemp("shop") / "uvicorn.log")
    base = f"http://127.0.0.1:{port}"
    process.start()
    try:

        def up() -> bool:
            assert process.alive(), f"the shop exited:\n{process.log_tail()}"
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        eventually(up, timeout=WAIT_S, what="the shop answers /healthz")
        yield base
    finally:
        process.terminate()


def order(base: str, who: dict[str, str], item: str, quantity: int) -> httpx.Response:
    return httpx.post(f"{base}/orders", json={"item": item, "quantity": quantity}, headers=who, timeout=30)


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"type", "message"} <= set(body["error"]), body
    found: dict[str, Any] = body["error"]
    return found


def stream_until_done(base: str, who: dict[str, str], thread_id: str, run_id: str) -> list[tuple[str, Any]]:
    """The thread's SSE frames (event, data) up to the run's completion."""
    seen: list[tuple[str, Any]] = []
    fields: dict[str, str] = {}
    deadline = time.monotonic() + WAIT_S
    url = f"{base}/agents/v1/threads/{thread_id}/events"
    with httpx.stream("GET", url, headers=who, timeout=WAIT_S) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            assert time.monotonic() < deadline, "the stream stalled"
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "data" in fields:
                event, data = fields.get("event", "message"), json.loads(fields["data"])
                seen.append((event, data))
                if event == "run" and data["run_id"] == run_id and data["payload"]["status"] == "completed":
                    return seen
            fields = {}
    raise AssertionError("the stream ended before the run did")


def test_an_order_and_its_run_commit_together_and_the_run_streams_its_reply(shop: str) -> None:
    placed = order(shop, ALICE, "blue mug", 2)
    assert placed.status_code == 201, placed.text
    body = placed.json()
    frames = stream_until_done(shop, ALICE, body["thread_id"], body["run_id"])
    reply = "Thank you for your order. Confirmed: 2 x blue mug. It ships tomorrow."
    [message] = [d for e, d in frames if e == "message" and d["payload"].get("role") == "assistant"]
    assert reply in json.dumps(message["payload"])
    # The example's model streams a few characters at a time: the reply arrives as it is written.
    assert "".join(data["text"] for event, data in frames if event == "text_delta") == reply
    assert [o["id"] for o in httpx.get(f"{shop}/orders", headers=ALICE).json()].count(body["id"]) == 1
    run = httpx.get(f"{shop}/agents/v1/runs/{body['run_id']}", headers=ALICE).json()
    assert run["status"] == "completed" and run["thread_id"] == body["thread_id"]


def test_a_customer_of_another_company_sees_neither_the_order_nor_its_run(shop: str) -> None:
    placed = order(shop, ALICE, "red pen", 1).json()
    assert error_of(httpx.get(f"{shop}/agents/v1/runs/{placed['run_id']}", headers=BOB), 404)["type"] == "run_not_found"
    events = httpx.get(f"{shop}/agents/v1/threads/{placed['thread_id']}/events", headers=BOB, timeout=10)
    assert error_of(events, 404)["type"] == "thread_not_found"
    assert placed["run_id"] not in [r["id"] for r in httpx.get(f"{shop}/agents/v1/runs", headers=BOB).json()]
    assert placed["id"] not in [o["id"] for o in httpx.get(f"{shop}/orders", headers=BOB).json()]


def test_an_order_rolled_back_after_it_was_written_starts_no_run(shop: str, migrated_pg_url: str) -> None:
    engine = sa.create_engine(migrated_pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            runs_before = connection.execute(sa.text("select count(*) from runs")).scalar_one()
            orders_before = connection.execute(sa.text("select count(*) from shop_orders")).scalar_one()
        refused = order(shop, ALICE, "a crate of mugs", 1000)
        assert refused.status_code == 409 and "at most 100" in refused.text
        with engine.connect() as connection:
            assert connection.execute(sa.text("select count(*) from runs")).scalar_one() == runs_before
            assert connection.execute(sa.text("select count(*) from shop_orders")).scalar_one() == orders_before
            messages = connection.execute(
                sa.text("select count(*) from messages where parts::text like '%a crate of mugs%'")
            ).scalar_one()
            assert messages == 0
    finally:
        engine.dispose()


def test_bad_input_gets_the_apis_documented_error_bodies(shop: str) -> None:
    assert error_of(httpx.get(f"{shop}/agents/v1/runs"), 401)["type"] == "unauthorized"
    invalid = error_of(httpx.post(f"{shop}/agents/v1/runs", json={"agent": "order_assistant"}, headers=ALICE), 422)
    assert invalid["type"] == "validation_error" and "message" in invalid["message"]
    unknown = httpx.post(f"{shop}/agents/v1/runs", json={"agent": "nobody", "message": "hi"}, headers=ALICE)
    assert error_of(unknown, 404)["type"] == "unknown_agent"
    big = httpx.post(
        f"{shop}/agents/v1/runs", json={"agent": "order_assistant", "message": "x" * (2 << 20)}, headers=ALICE
    )
    assert error_of(big, 413)["type"] == "payload_too_large"
    assert order(shop, ALICE, "", 0).status_code == 422  # the shop's own route: FastAPI's own answer


def test_staff_see_their_tenants_runs_in_the_console_behind_http_basic(shop: str) -> None:
    placed = order(shop, ALICE, "green cup", 3).json()
    refused = httpx.get(f"{shop}/staff/console/")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert "text/html" in refused.headers["content-type"]
    page = httpx.get(f"{shop}/staff/console/runs/{placed['run_id']}", auth=("carol", "carol-password"))
    assert page.status_code == 200 and 'id="principal">carol' in page.text
    assert httpx.get(f"{shop}/staff/console/", auth=("carol", "wrong")).status_code == 401
