"""Ownership in the HTTP API: each token is a principal of a tenant, and tenants never meet.

Two tenants share one embedded runtime. Everything tenant ``acme`` owns (a finished run, a run
whose call awaits approval, a run waiting for a variable whose agent tool ran a child) is asked
for, listed, streamed, cancelled, approved, denied, resolved, cleared and given variables by
tenant ``globex``: every request answers 404 exactly as an unknown id does, and nothing changes;
starting a run with acme's thread or run id starts one of globex's own.
A last test checks that every ``/v1`` route of the app was exercised here, so a new route cannot
slip past these checks unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import select

from tests.support.waiting import eventually
from threads_celery import Agent, Threads, Variable, agent_tool, tool
from threads_celery.api.app import create_api
from threads_celery.store.schema import tool_calls
from threads_celery.testing import ScriptedModel, call, say

ALICE = {"Authorization": "Bearer tok-alice-acme-0123456789"}
CAROL = {"Authorization": "Bearer tok-carol-acme-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-globex-0123456789"}
LEGACY = {"Authorization": "Bearer legacy-bare-token-0123456789"}
TOKENS = (
    "alice@acme=tok-alice-acme-0123456789, carol@acme=tok-carol-acme-0123456789,"
    "bob@globex=tok-bob-globex-0123456789, legacy-bare-token-0123456789"
)
EXERCISED: set[tuple[str, str]] = set()


class Mail(BaseModel):
    to: str


class Q(BaseModel):
    q: str


send = tool(
    name="send", description="Send mail.", input=Mail, execute=lambda i, c: f"sent to {i.to}"
)  # unguarded: asks
lookup = tool(
    name="lookup", description="x", input=Q, effect="read_only",
    execute=lambda i, c: f"region={c.env('REGION')}", variables=[Variable("REGION", required=True)],
)  # fmt: skip
greeter = Agent(name="t-greeter", instructions="x", model=ScriptedModel([say("hello")], per="run"))
mailer = Agent(
    name="t-mailer",
    instructions="x",
    model=ScriptedModel([call("send", to="ann@acme.test"), say("sent")], per="run"),
    tools=[send],
)
researcher = Agent(name="t-researcher", instructions="x", model=ScriptedModel([say("found it")], per="run"))
parent = Agent(
    name="t-parent", instructions="x", tools=[agent_tool(researcher, "Research."), lookup],
    model=ScriptedModel([call("t_researcher", message="look"), call("lookup", q="x"), say("done")], per="run"),
)  # fmt: skip


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[TestClient, Threads]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())
        with Threads.embedded() as threads:
            for agent in (greeter, mailer, parent):
                threads.register(agent)
            app = create_api(threads, env={"THREADS_API_TOKENS": TOKENS}, keepalive_s=0.2, poll_interval_s=0.02)
            with TestClient(app) as http:
                yield http, threads


def request(http: TestClient, method: str, path: str, route: str, headers: dict[str, str], **kwargs: Any) -> Any:
    EXERCISED.add((method, route))
    return http.request(method, path, headers=headers, **kwargs)


def wait_for(threads: Threads, run_id: str, status: str) -> None:
    eventually(
        lambda: threads.get_run(run_id).status == status,
        timeout=20,
        what=f"run {run_id} {status}",
        detail=lambda: threads.get_run(run_id).status,
    )


@pytest.fixture(scope="module")
def acme(world: tuple[TestClient, Threads]) -> dict[str, str]:
    """What alice (tenant acme) owns: ids of runs, threads, a call awaiting approval, a child run."""
    http, threads = world

    def start(agent: str) -> dict[str, str]:
        response = request(http, "POST", "/v1/runs", "/v1/runs", ALICE, json={"agent": agent, "message": "go"})
        assert response.status_code == 202, response.text
        return response.json()  # type: ignore[no-any-return]

    done = start("t-greeter")
    wait_for(threads, done["run_id"], "completed")
    asking = start("t-mailer")
    wait_for(threads, asking["run_id"], "awaiting_approval")
    [call_key] = [c.effect_key for c in threads.parked() if c.run_id == asking["run_id"]]
    waiting = start("t-parent")
    wait_for(threads, waiting["run_id"], "awaiting_variable")
    [child] = threads.agent_tool_runs(waiting["thread_id"])
    assert child.child_thread_id is not None
    return {
        "run": done["run_id"], "thread": done["thread_id"], "asking_run": asking["run_id"], "call": call_key,
        "waiting_run": waiting["run_id"], "parent_thread": waiting["thread_id"], "child_run": child.run_id,
        "child_thread": child.child_thread_id,
    }  # fmt: skip


def not_found_like_an_unknown_id(response: Any, kind: str) -> None:
    assert response.status_code == 404, response.text
    assert response.json()["error"]["type"] == kind
    assert "acme" not in response.text and "alice" not in response.text


def snapshot(threads: Threads, acme: dict[str, str]) -> Any:
    """Everything a request from another tenant could have changed."""
    with threads.store.read() as tx:
        calls = [tuple(r) for r in tx.conn.execute(select(tool_calls).order_by(tool_calls.c.effect_key))]
    return (
        [(r.id, r.status, r.thread_id) for r in threads.runs(limit=1000)],
        calls,
        [(r.run_id, r.status) for r in threads.agent_tool_runs(acme["parent_thread"])],
        threads.env(acme["parent_thread"]),
        [len(threads.messages(t)) for t in (acme["thread"], acme["parent_thread"], acme["child_thread"])],
    )


def test_another_tenant_gets_404_for_everything_and_changes_nothing(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    http, threads = world
    before = snapshot(threads, acme)
    run, thread, key = acme["run"], acme["thread"], acme["call"]
    parent_thread, child_run, child_thread = acme["parent_thread"], acme["child_run"], acme["child_thread"]
    checks = [
        ("GET", f"/v1/runs/{run}", "/v1/runs/{run_id}", {}, "run_not_found"),
        ("POST", f"/v1/runs/{acme['asking_run']}/cancel", "/v1/runs/{run_id}/cancel", {}, "run_not_found"),
        ("GET", f"/v1/threads/{thread}/messages", "/v1/threads/{thread_id}/messages", {}, "thread_not_found"),
        ("GET", f"/v1/threads/{child_thread}/messages", "/v1/threads/{thread_id}/messages", {}, "thread_not_found"),
        ("GET", f"/v1/threads/{thread}/events", "/v1/threads/{thread_id}/events", {}, "thread_not_found"),
        ("GET", f"/v1/threads/{child_thread}/events", "/v1/threads/{thread_id}/events", {"headers": {"Last-Event-ID": "1"}}, "thread_not_found"),
        ("POST", f"/v1/calls/{key}/approve", "/v1/calls/{effect_key}/approve", {"json": {"principal": "alice"}}, "call_not_found"),
        ("POST", f"/v1/calls/{key}/deny", "/v1/calls/{effect_key}/deny", {"json": {"reason": "no"}}, "call_not_found"),
        ("POST", f"/v1/calls/{key}/resolve", "/v1/calls/{effect_key}/resolve", {"json": {"resolution": "assume_done"}}, "call_not_found"),
        ("GET", f"/v1/threads/{parent_thread}/agent-tool-runs", "/v1/threads/{thread_id}/agent-tool-runs", {}, "thread_not_found"),
        ("DELETE", f"/v1/threads/{parent_thread}/agent-tool-runs", "/v1/threads/{thread_id}/agent-tool-runs", {}, "thread_not_found"),
        ("GET", f"/v1/threads/{parent_thread}/agent-tool-runs/{child_run}/events",
         "/v1/threads/{thread_id}/agent-tool-runs/{run_id}/events", {}, "thread_not_found"),
        ("POST", f"/v1/threads/{parent_thread}/env", "/v1/threads/{thread_id}/env", {"json": {"name": "REGION", "value": "x"}}, "thread_not_found"),
        ("GET", f"/v1/runs/{acme['asking_run']}/pending", "/v1/runs/{run_id}/pending", {}, "run_not_found"),
        ("GET", f"/v1/calls/{key}/result", "/v1/calls/{effect_key}/result", {}, "call_not_found"),
        ("GET", f"/v1/runs/{run}/usage", "/v1/runs/{run_id}/usage", {}, "run_not_found"),
        ("GET", f"/v1/threads/{thread}/usage", "/v1/threads/{thread_id}/usage", {}, "thread_not_found"),
        ("POST", f"/v1/runs/{run}/allow-usage", "/v1/runs/{run_id}/allow-usage", {"json": {}}, "run_not_found"),
        ("GET", f"/v1/threads/{thread}/branches", "/v1/threads/{thread_id}/branches", {}, "thread_not_found"),
        ("POST", f"/v1/threads/{thread}/rewind", "/v1/threads/{thread_id}/rewind", {"json": {"at": 0}}, "thread_not_found"),
        ("POST", f"/v1/threads/{thread}/fork", "/v1/threads/{thread_id}/fork", {"json": {"at": 0}}, "thread_not_found"),
        ("POST", f"/v1/threads/{thread}/regenerate", "/v1/threads/{thread_id}/regenerate", {"json": {}}, "thread_not_found"),
        ("POST", f"/v1/threads/{thread}/edit", "/v1/threads/{thread_id}/edit", {"json": {"run_id": run, "text": "x"}}, "thread_not_found"),
    ]  # fmt: skip
    for method, path, route, kwargs, kind in checks:
        headers = {**BOB, **kwargs.pop("headers", {})}
        response = request(http, method, path, route, headers, **kwargs)
        not_found_like_an_unknown_id(response, kind)
        # The same request for an id that exists nowhere answers the same way.
        if ("{" in route and method != "POST") or route.endswith(("/approve", "/deny", "/resolve", "/cancel", "/env")):
            unknown = (
                path.replace(run, "run_nowhere")
                .replace(acme["asking_run"], "run_nowhere")
                .replace(key, "run_nowhere:0:0")
            )
            for own in (child_thread, parent_thread, thread):
                unknown = unknown.replace(own, "thread_nowhere")
            assert http.request(method, unknown, headers=headers, **kwargs).status_code == 404
    assert snapshot(threads, acme) == before


def test_chat_requests_of_another_tenant_answer_nothing_of_theirs(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    """The chat protocols' routes: acme's approval answered by globex is 404, acme's run is not resumed for it."""
    http, threads = world
    before = snapshot(threads, acme)
    thread, key = acme["thread"], acme["call"]
    answered = {
        "type": "tool-send", "toolCallId": "call_x", "state": "approval-responded", "input": {"to": "x"},
        "approval": {"id": key, "approved": True},
    }  # fmt: skip
    vercel = {
        "id": thread, "trigger": "submit-message",
        "messages": [{"id": "reply-x", "role": "assistant", "parts": [answered]}],
    }  # fmt: skip
    response = request(http, "POST", "/v1/chat/vercel-ai/t-mailer", "/v1/chat/vercel-ai/{agent}", BOB, json=vercel)
    not_found_like_an_unknown_id(response, "call_not_found")
    ag_ui = {
        "threadId": thread, "runId": "r1", "state": {}, "messages": [], "tools": [], "context": [],
        "forwardedProps": {}, "resume": [{"interruptId": key, "status": "resolved", "payload": {"approved": True}}],
    }  # fmt: skip
    response = request(http, "POST", "/v1/chat/ag-ui/t-mailer", "/v1/chat/ag-ui/{agent}", BOB, json=ag_ui)
    not_found_like_an_unknown_id(response, "call_not_found")
    # acme's run that waits for approval is, for globex, a chat with nothing in progress: as one that never was.
    resume = "/v1/chat/vercel-ai/{agent}/{chat_id}/stream"
    response = request(http, "GET", f"/v1/chat/vercel-ai/t-mailer/{acme['asking_run']}/stream", resume, BOB)
    assert response.status_code == 204
    asking_thread = threads.get_run(acme["asking_run"]).thread_id
    assert http.get(f"/v1/chat/vercel-ai/t-mailer/{asking_thread}/stream", headers=BOB).status_code == 204
    assert http.get("/v1/chat/vercel-ai/t-mailer/thread_nowhere/stream", headers=BOB).status_code == 204
    history = "/v1/chat/vercel-ai/{agent}/{chat_id}/messages"
    assert request(http, "GET", f"/v1/chat/vercel-ai/t-mailer/{asking_thread}/messages", history, BOB).json() == []
    assert snapshot(threads, acme) == before


def test_listings_show_only_the_callers_tenant(world: tuple[TestClient, Threads], acme: dict[str, str]) -> None:
    http, _ = world
    acme_runs = {acme["run"], acme["asking_run"], acme["waiting_run"]}
    for headers, sees in ((BOB, False), (LEGACY, False), (ALICE, True), (CAROL, True)):
        runs = request(http, "GET", "/v1/runs", "/v1/runs", headers).json()
        assert (acme_runs <= {r["id"] for r in runs}) is sees
        if not sees:
            assert not acme_runs & {r["id"] for r in runs}
            assert (
                request(http, "GET", "/v1/runs", "/v1/runs", headers, params={"thread_id": acme["thread"]}).json() == []
            )
        parked = request(http, "GET", "/v1/parked", "/v1/parked", headers).json()
        assert (acme["call"] in {p["effect_key"] for p in parked}) is sees
        own = request(
            http, "GET", f"/v1/threads/{acme['child_thread']}/messages", "/v1/threads/{thread_id}/messages", headers
        )
        assert own.status_code == (200 if sees else 404)  # a child thread belongs to its parent's tenant
        usage = request(http, "GET", "/v1/usage", "/v1/usage", headers, params={"agent": "t-greeter"}).json()
        assert (usage["requests"] > 0) is sees, usage  # another tenant's model usage is not summed in


def test_another_tenants_ids_start_a_run_of_the_callers_own(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    """An id of acme's, given by globex, is an unused id: globex gets a run and thread of its own."""
    http, threads = world
    before = [(r.id, r.status) for r in threads.runs(limit=1000, tenant="acme")]
    messages = [len(threads.messages(t)) for t in (acme["thread"], acme["parent_thread"])]
    # The last one is globex's own run of the one before, returned as it is (idempotent).
    for ids in (
        {"thread_id": acme["thread"]},
        {"run_id": acme["run"], "thread_id": acme["thread"]},
        {"run_id": acme["run"]},
    ):
        response = request(
            http, "POST", "/v1/runs", "/v1/runs", BOB, json={"agent": "t-greeter", "message": "x", **ids}
        )
        assert response.status_code == 202, response.text
        started = response.json()
        assert {k: started[k] for k in ids} == ids and "acme" not in response.text
        path = f"/v1/runs/{started['run_id']}"
        eventually(
            lambda path=path: http.get(path, headers=BOB).json()["status"] == "completed",
            timeout=20,
            what=f"globex's run {started['run_id']} completed",
        )
    assert (
        request(http, "GET", f"/v1/runs/{acme['run']}", "/v1/runs/{run_id}", BOB).json()["thread_id"] == acme["thread"]
    )
    assert [(r.id, r.status) for r in threads.runs(limit=1000, tenant="acme")] == before
    assert [len(threads.messages(t)) for t in (acme["thread"], acme["parent_thread"])] == messages


def test_each_tenant_works_in_its_own_space(world: tuple[TestClient, Threads]) -> None:
    http, threads = world
    mine = request(http, "POST", "/v1/runs", "/v1/runs", BOB, json={"agent": "t-greeter", "message": "hi"}).json()
    wait_for(threads, mine["run_id"], "completed")
    assert request(http, "GET", f"/v1/runs/{mine['run_id']}", "/v1/runs/{run_id}", BOB).status_code == 200
    assert request(http, "GET", f"/v1/runs/{mine['run_id']}", "/v1/runs/{run_id}", ALICE).status_code == 404
    EXERCISED.add(("GET", "/v1/threads/{thread_id}/events"))
    with http.stream("GET", f"/v1/threads/{mine['thread_id']}/events", headers=BOB, params={"after": 0}) as stream:
        assert stream.status_code == 200
        first = next(line for line in stream.iter_lines() if line.startswith("data:"))
        assert mine["run_id"] in first
    assert threads.tenant_of(thread_id=mine["thread_id"]) == "globex"


def test_decisions_record_the_tokens_principal_not_the_bodys(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    http, threads = world
    key = acme["call"]
    response = request(
        http, "POST", f"/v1/calls/{key}/approve", "/v1/calls/{effect_key}/approve", CAROL, json={"principal": "the-ceo"}
    )
    assert response.status_code == 200, response.text
    with threads.store.read() as tx:
        approved_by = tx.conn.execute(select(tool_calls.c.approved_by).where(tool_calls.c.effect_key == key)).scalar()
    assert approved_by == "carol"
    wait_for(threads, acme["asking_run"], "completed")
    env = request(
        http,
        "POST",
        f"/v1/threads/{acme['parent_thread']}/env",
        "/v1/threads/{thread_id}/env",
        ALICE,
        json={"name": "REGION", "value": "eu"},
    )
    assert env.status_code == 200 and env.json()["resumed_calls"] == 1
    wait_for(threads, acme["waiting_run"], "completed")


def test_fleet_metrics_hold_counts_never_another_tenants_ids(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    http, _ = world
    response = request(http, "GET", "/v1/metrics", "/v1/metrics", BOB)
    if response.status_code == 501:
        pytest.skip("prometheus-client is not installed")
    assert response.status_code == 200
    for value in acme.values():
        assert value not in response.text


def test_a_chat_on_another_tenants_thread_id_is_the_callers_own(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    http, threads = world
    thread = acme["thread"]
    before = [len(threads.messages(t)) for t in (acme["thread"], acme["parent_thread"])]
    # A message on acme's thread id starts globex's own run on a thread of its own.
    message = {"id": "m-chat-1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    mine = {"id": thread, "trigger": "submit-message", "messages": [message]}
    response = http.post("/v1/chat/vercel-ai/t-greeter", json=mine, headers=BOB)
    assert response.status_code == 200 and "acme" not in response.text
    assert f'"threadId":"{thread}","runId":"m-chat-1"' in response.text and '"delta":"hello"' in response.text
    assert threads.tenant_of(run_id="globex~m-chat-1") == "globex"
    assert [len(threads.messages(t)) for t in (acme["thread"], acme["parent_thread"])] == before


def test_the_deploy_routes_answer_only_the_operators_tenant(
    world: tuple[TestClient, Threads], acme: dict[str, str]
) -> None:
    http, threads = world
    before = snapshot(threads, acme)
    for method, route, kwargs in (
        ("GET", "/v1/deploy", {}),
        ("POST", "/v1/deploy/upgrade", {"json": {"from": "v1", "to": "v2"}}),
    ):
        for caller in (ALICE, BOB):  # both are tenants' callers, not the operators'
            response = request(http, method, route, route, caller, **kwargs)
            assert response.status_code == 403, response.text
            assert response.json()["error"]["type"] == "forbidden"
    assert snapshot(threads, acme) == before


def test_every_v1_route_was_exercised_across_tenants(world: tuple[TestClient, Threads]) -> None:
    http, _ = world
    paths = http.app.openapi()["paths"]  # type: ignore[attr-defined]
    routes = {
        (method.upper(), path) for path, operations in paths.items() if path.startswith("/v1/") for method in operations
    }
    assert len(routes) >= 15
    assert routes - EXERCISED == set(), "a /v1 route has no cross-tenant check in this module"
