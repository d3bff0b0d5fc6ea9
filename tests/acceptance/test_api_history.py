"""``GET /v1/threads/{id}/export`` and ``DELETE /v1/threads/{id}`` (on with ``THREADS_API_HISTORY``).

A caller exports and erases only its own tenant's threads, sees the ids it chose (never the
stored, scoped form), and a running thread is a 409 naming why; without the setting the routes
are not there at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from threads_celery import Agent, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

ALICE = {"Authorization": "Bearer tok-alice-acme-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-globex-0123456789"}
TOKENS = "alice@acme=tok-alice-acme-0123456789,bob@globex=tok-bob-globex-0123456789"


class Mail(BaseModel):
    to: str


send = tool(name="send", description="Send mail.", input=Mail, execute=lambda i, c: "sent")  # unguarded: asks
greeter = Agent(name="h-greeter", instructions="x", model=ScriptedModel([say("hello")], per="run"))
mailer = Agent(
    name="h-mailer", instructions="x", tools=[send],
    model=ScriptedModel([call("send", to="ann@acme.test"), say("sent")], per="run"),
)  # fmt: skip


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[TestClient, Threads]]:
    with Threads.embedded() as threads:
        for agent in (greeter, mailer):
            threads.register(agent)
        app = create_api(threads, env={"THREADS_API_TOKENS": TOKENS, "THREADS_API_HISTORY": "1"})
        with TestClient(app) as http:
            yield http, threads


def _finished(http: TestClient, threads: Threads, agent: str, thread_id: str, status: str = "completed") -> str:
    started = http.post("/v1/runs", json={"agent": agent, "message": "go", "thread_id": thread_id}, headers=ALICE)
    assert started.status_code == 202, started.text
    run_id: str = started.json()["run_id"]  # server-generated: stored as shown
    assert threads.wait(run_id, timeout=30).status == status
    return run_id


def test_a_caller_exports_and_erases_its_own_thread_under_the_ids_it_chose(world: tuple[TestClient, Threads]) -> None:
    http, threads = world
    _finished(http, threads, "h-greeter", "order-1")
    exported = http.get("/v1/threads/order-1/export", headers=ALICE)
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert lines[0]["record"] == "header" and lines[0]["version"] == 1 and lines[-1]["record"] == "end"
    assert lines[0]["scope"] == {"thread": "order-1"}
    assert {r["row"]["id"] for r in lines if r["record"] == "thread"} == {"order-1"}
    assert "acme~" not in exported.text

    for other in (http.get("/v1/threads/order-1/export", headers=BOB), http.delete("/v1/threads/order-1", headers=BOB)):
        assert other.status_code == 404 and other.json()["error"]["type"] == "thread_not_found"
    assert threads.tenant_of(thread_id="acme~order-1") == "acme"  # nothing changed

    erased = http.delete("/v1/threads/order-1", headers=ALICE)
    assert erased.status_code == 200, erased.text
    report = erased.json()
    assert report["threads"] == ["order-1"] and report["rows"]["messages"] == 2 and report["refused"] == []
    assert http.get("/v1/threads/order-1/export", headers=ALICE).status_code == 404


def test_a_running_thread_is_a_409_naming_why(world: tuple[TestClient, Threads]) -> None:
    http, threads = world
    _finished(http, threads, "h-mailer", "mail-1", status="awaiting_approval")
    for answer in (
        http.get("/v1/threads/mail-1/export", headers=ALICE),
        http.delete("/v1/threads/mail-1", headers=ALICE),
    ):
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["type"] == "history_refused" and "is running" in error["message"]
        assert "acme~" not in error["message"]
    assert threads.tenant_of(thread_id="acme~mail-1") == "acme"


def test_without_the_setting_the_routes_are_not_there() -> None:
    with Threads.embedded() as threads:
        app = create_api(threads, env={"THREADS_API_TOKENS": TOKENS})
        with TestClient(app) as http:
            assert http.get("/v1/threads/x/export", headers=ALICE).status_code == 404
            assert http.delete("/v1/threads/x", headers=ALICE).status_code in (404, 405)
