"""``api_router(threads, caller=...)`` in a user's FastAPI app that has exception handlers of its own.

The shop's handlers answer its own routes in its own shapes; the agents' routes, included under
``/agents``, keep the API's documented error bodies (401, 404, 409, 413, 422) all the same, and
their event stream streams (served by uvicorn on a real socket). The whole API mounted under a
path serves the same.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRouter
from fastapi.testclient import TestClient
from pydantic import BaseModel

from tests.support.processes import free_port
from tests.support.waiting import eventually
from threads_celery import Agent, Threads
from threads_celery.api import Caller, api_router, create_api
from threads_celery.api.router import ApiRoute
from threads_celery.exceptions import ConfigError
from threads_celery.testing import ScriptedModel, say

USERS = {"key-alice": Caller("alice", "acme"), "key-bob": Caller("bob", "globex")}
ALICE = {"X-API-Key": "key-alice"}
BOB = {"X-API-Key": "key-bob"}
LIMIT = 4096
GREETER = Agent(name="router_greeter", instructions="Greet.", model=ScriptedModel([say("hello")]))
REPLY = "Streaming through the shop's own app, a few characters at a time, so that deltas arrive."
WRITER = Agent(
    name="router_writer", instructions="Write.", model=ScriptedModel([say(REPLY)], chunk_size=5, chunk_delay_s=0.05)
)


def api_key_user(x_api_key: Annotated[str | None, Header()] = None) -> Caller:
    found = USERS.get(x_api_key or "")
    if found is None:
        raise HTTPException(401, "unknown API key")
    return found


class OrderIn(BaseModel):
    item: str


def shop_app(threads: Threads) -> FastAPI:
    """A product's app: its own routes and its own error shapes, the agents under /agents."""
    shop = FastAPI(title="shop")

    @shop.exception_handler(HTTPException)
    async def shop_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"shop_error": exc.detail}, status_code=exc.status_code)

    @shop.exception_handler(RequestValidationError)
    async def shop_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"shop_invalid": True}, status_code=400)

    @shop.get("/orders/{number}")
    def get_order(number: int) -> dict[str, int]:
        if number != 1:
            raise HTTPException(404, "no such order")
        return {"number": 1}

    @shop.post("/orders")
    def new_order(order: OrderIn) -> dict[str, str]:
        return {"item": order.item}

    shop.include_router(api_router(threads, caller=api_key_user, max_body_bytes=LIMIT), prefix="/agents")
    shop.mount("/whole", create_api(threads, caller=api_key_user, console=False, max_body_bytes=LIMIT))
    return shop


@pytest.fixture(scope="module")
def threads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    with Threads.embedded(tmp_path_factory.mktemp("router") / "threads.db") as runtime:
        runtime.register(GREETER)
        runtime.register(WRITER)
        yield runtime


@pytest.fixture(scope="module")
def client(threads: Threads) -> Iterator[TestClient]:
    with TestClient(shop_app(threads)) as c:
        yield c


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The API's error body, after checking its status and that it is the documented shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"type", "message"} <= set(body["error"]), body
    found: dict[str, Any] = body["error"]
    return found


def test_the_shops_own_routes_keep_the_shops_handlers(client: TestClient) -> None:
    assert client.get("/orders/2").json() == {"shop_error": "no such order"}
    refused = client.post("/orders", json={})
    assert refused.status_code == 400 and refused.json() == {"shop_invalid": True}


@pytest.mark.parametrize("prefix", ["/agents", "/whole"])
def test_the_agents_routes_answer_in_the_apis_documented_shapes(client: TestClient, prefix: str) -> None:
    runs = f"{prefix}/v1/runs"
    assert error_of(client.get(runs), 401) == {"type": "unauthorized", "message": "unknown API key"}
    invalid = error_of(client.post(runs, json={"message": "hi"}, headers=ALICE), 422)
    assert invalid["type"] == "validation_error" and invalid["details"][0]["loc"] == ["body", "agent"]
    malformed = error_of(
        client.post(runs, content=b"{not json", headers={**ALICE, "Content-Type": "application/json"}), 422
    )
    assert malformed["message"].startswith("the body is not valid JSON")
    assert error_of(client.post(runs, json={"agent": "nobody", "message": "hi"}, headers=ALICE), 404)["type"] == (
        "unknown_agent"
    )
    assert error_of(client.get(f"{runs}/run_nope", headers=ALICE), 404)["type"] == "run_not_found"
    assert error_of(client.get(f"{prefix}/v1/runs/bad id!", headers=ALICE), 422)["type"] == "validation_error"


def test_a_body_over_the_limit_is_a_413_by_its_length_or_as_it_streams(client: TestClient) -> None:
    big = json.dumps({"agent": GREETER.name, "message": "x" * LIMIT}).encode()
    for prefix in ("/agents", "/whole"):
        declared = client.post(f"{prefix}/v1/runs", content=big, headers={**ALICE, "Content-Type": "application/json"})
        assert error_of(declared, 413)["type"] == "payload_too_large"

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(big), 1024):
                yield big[start : start + 1024]

        streamed = client.post(
            f"{prefix}/v1/runs", content=chunks(), headers={**ALICE, "Content-Type": "application/json"}
        )
        assert "content-length" not in streamed.request.headers  # chunked: only counting can tell
        assert error_of(streamed, 413)["message"] == f"the request body is over the limit of {LIMIT} bytes"


@pytest.mark.parametrize("prefix", ["/agents", "/whole"])
def test_runs_belong_to_the_dependencys_tenant_and_their_location_is_under_the_prefix(
    client: TestClient, prefix: str
) -> None:
    thread_id = f"chat{prefix.replace('/', '-')}"
    started = client.post(
        f"{prefix}/v1/runs", json={"agent": GREETER.name, "message": "hi", "thread_id": thread_id}, headers=ALICE
    )
    assert started.status_code == 202, started.text
    location = started.headers["location"]
    assert location == f"{prefix}/v1/runs/{started.json()['run_id']}"
    assert client.get(location, headers=ALICE).json()["thread_id"] == thread_id
    assert error_of(client.get(location, headers=BOB), 404)["type"] == "run_not_found"
    # A thread of another agent is a conflict, in the documented shape.
    other = client.post(
        f"{prefix}/v1/runs", json={"agent": WRITER.name, "message": "hi", "thread_id": thread_id}, headers=ALICE
    )
    conflict = error_of(other, 409)
    assert conflict["type"] == "conflict" and thread_id in conflict["message"]
    assert "acme~" not in conflict["message"]  # the caller's own ids, never the stored, scoped ones


def test_the_shops_openapi_lists_the_agents_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/agents/v1/runs" in paths and "/orders/{number}" in paths


def test_the_apps_dependency_overrides_reach_the_agents_routes(threads: Threads) -> None:
    shop = shop_app(threads)
    shop.dependency_overrides[api_key_user] = lambda: Caller("tester", "acme")
    with TestClient(shop) as c:
        assert c.get("/agents/v1/runs").status_code == 200  # no key: the override answered
    assert error_of(TestClient(shop_app(threads)).get("/agents/v1/runs"), 401)["type"] == "unauthorized"


def test_an_unexpected_error_goes_on_to_the_apps_own_handling() -> None:
    router = APIRouter(route_class=ApiRoute)

    @router.get("/broken")
    def broken() -> None:
        raise RuntimeError("a bug")

    app = FastAPI()

    @app.exception_handler(RuntimeError)
    async def reported(request: Request, exc: RuntimeError) -> JSONResponse:
        return JSONResponse({"reported": str(exc)}, status_code=500)

    app.include_router(router)
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.get("/broken").json() == {"reported": "a bug"}


def test_the_body_limit_defaults_to_the_apis_variable(threads: Threads, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_API_MAX_BODY_BYTES", "100")
    app = FastAPI()
    app.include_router(api_router(threads, caller=api_key_user))
    body = {"agent": GREETER.name, "message": "x" * 100}
    with TestClient(app) as c:
        assert error_of(c.post("/v1/runs", json=body, headers=ALICE), 413)["message"].endswith("limit of 100 bytes")
    monkeypatch.setenv("THREADS_API_MAX_BODY_BYTES", "lots")
    with pytest.raises(ConfigError, match="THREADS_API_MAX_BODY_BYTES must be a positive integer"):
        api_router(threads, caller=api_key_user)


def test_the_router_refuses_what_it_cannot_serve(threads: Threads) -> None:
    with pytest.raises(TypeError, match="api_router takes a Threads runtime"):
        api_router("postgresql://...", caller=api_key_user)  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(TypeError, match="caller= takes a FastAPI dependency"):
        api_router(threads, caller=None)  # type: ignore[arg-type]  # the mistake under test


# -- the event stream, on a real socket --------------------------------------------------------


@pytest.fixture(scope="module")
def served(threads: Threads) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(shop_app(threads), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started, timeout=20, what="uvicorn started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def sse_events(response: httpx.Response, run_id: str, *, deadline_s: float = 30.0) -> list[tuple[str, dict[str, Any]]]:
    """The stream's (event, data) frames up to the run's completion."""
    seen: list[tuple[str, dict[str, Any]]] = []
    fields: dict[str, str] = {}
    deadline = time.monotonic() + deadline_s
    for line in response.iter_lines():
        assert time.monotonic() < deadline, "the stream stalled"
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:
            frame = (fields.get("event", "message"), json.loads(fields["data"]))
            seen.append(frame)
            data = frame[1]
            if frame[0] == "run" and data.get("run_id") == run_id and data["payload"]["status"] == "completed":
                return seen
        fields = {}
    raise AssertionError("the stream ended before the run did")


@pytest.mark.parametrize("prefix", ["/agents", "/whole"])
def test_the_event_stream_streams_through_the_shops_app(served: str, prefix: str) -> None:
    thread_id = f"stream{prefix.replace('/', '-')}"
    started = httpx.post(
        f"{served}{prefix}/v1/runs", json={"agent": WRITER.name, "message": "go", "thread_id": thread_id}, headers=ALICE
    )
    assert started.status_code == 202, started.text
    with httpx.stream("GET", f"{served}{prefix}/v1/threads/{thread_id}/events", headers=ALICE, timeout=30) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        seen = sse_events(response, started.json()["run_id"])
    deltas = "".join(data["text"] for event, data in seen if event == "text_delta")
    assert deltas == REPLY
    refused = httpx.get(f"{served}{prefix}/v1/threads/{thread_id}/events", headers=BOB, timeout=30)
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "thread_not_found"
