"""The HTTP API as a web app uses it: FastAPI's TestClient on an embedded runtime.

One embedded runtime (SQLite and the in-process worker) serves the whole module; every test
starts runs of its own. The agents are scripted, so nothing leaves the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import update

from tests.support.processes import THREADS_CELERY, ManagedProcess, free_port
from tests.support.waiting import eventually
from threads_celery import Agent, Permissions, Threads, agent_tool, tool
from threads_celery.api.app import create_api
from threads_celery.exceptions import BrokerUnavailable, ConfigError, StoreUnavailable
from threads_celery.store.schema import runs as runs_table
from threads_celery.store.schema import tool_calls
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STREAM_DEADLINE_S = 30.0

SENT: list[str] = []
SENT_LOCK = threading.Lock()


class EmailIn(BaseModel):
    to: str
    body: str = "hi"


def _send(inp: EmailIn, ctx: Any) -> str:
    with SENT_LOCK:
        SENT.append(inp.to)
    return f"sent to {inp.to}"


send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=_send)
greeter = Agent(name="api_greeter", instructions="Greet.", model=ScriptedModel([say("Hello from the API.")]))
# send_email is unguarded, so under the default permissions every call waits for a person.
mailer = Agent(
    name="api_mailer",
    instructions="Send what you are asked to.",
    model=ScriptedModel([call("send_email", to="ann@example.com"), say("Sent.")]),
    tools=[send_email],
)


# A parent whose child would send mail freely: the parent's default permissions cap the child, so
# the child's call waits for a person and shows at the parent as a pending entry of kind child.
child_mailer = Agent(
    name="api_child_mailer",
    instructions="Send what you are asked to.",
    model=ScriptedModel([call("send_email", to="cat@example.com"), say("Child sent it.")]),
    tools=[send_email],
    permissions=Permissions.allow_all(),
)
delegator = Agent(
    name="api_delegator",
    instructions="Delegate.",
    model=ScriptedModel([call("mail_helper", message="mail cat"), say("Delegated.")]),
    tools=[agent_tool(child_mailer, "Sends mail.", name="mail_helper")],
)


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded() as runtime:
        runtime.register(greeter)
        runtime.register(mailer)
        runtime.register(delegator)
        yield runtime


@pytest.fixture(scope="module")
def client(threads: Threads) -> Iterator[TestClient]:
    app = create_api(threads, tokens={TOKEN, "another-token"}, keepalive_s=0.2, poll_interval_s=0.02)
    with TestClient(app) as test_client:
        yield test_client


def start(client: TestClient, agent: str, message: str = "hi", **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/runs", json={"agent": agent, "message": message, **extra}, headers=AUTH)
    assert response.status_code == 202, response.text
    return response.json()


def awaiting_approval(client: TestClient, threads: Threads) -> tuple[dict[str, Any], str]:
    """A mailer run that waits for approval of its send_email call, and that call's effect key."""
    started = start(client, "api_mailer", "mail ann")
    assert threads.wait(started["run_id"], 20).status == "awaiting_approval"
    parked = client.get("/v1/parked", headers=AUTH).json()
    [pending] = [p for p in parked if p["run_id"] == started["run_id"]]
    assert pending["status"] == "awaiting_approval" and pending["tool"] == "send_email"
    return started, pending["effect_key"]


def assert_error(response: Any, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body["error"]) >= {"type", "message"} and body["error"]["type"] == kind, body
    assert body["error"]["message"]
    assert "Traceback" not in response.text
    return body["error"]


# -- SSE ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    id: int
    event: str
    data: dict[str, Any]


def read_frames(lines: Iterator[str], until: Callable[[Frame], bool]) -> list[Frame]:
    """Parse SSE frames from ``lines`` (one ``iter_lines()`` per stream) until ``until(frame)``.

    The keepalive comments, every 0.2 s here, bound each wait, so the deadline is checked.
    """
    frames: list[Frame] = []
    fields: dict[str, str] = {}
    deadline = time.monotonic() + STREAM_DEADLINE_S
    for line in lines:
        assert time.monotonic() < deadline, f"the stream stalled; frames so far: {[f.id for f in frames]}"
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "id" in fields:
            frame = Frame(id=int(fields["id"]), event=fields["event"], data=json.loads(fields["data"]))
            frames.append(frame)
            if until(frame):
                return frames
        fields = {}
    raise AssertionError("the stream ended")


def run_status_is(*statuses: str) -> Callable[[Frame], bool]:
    return lambda f: f.event == "run" and f.data["payload"].get("status") in statuses


# -- runs --------------------------------------------------------------------------------------


def test_start_a_run_then_read_it_list_it_and_its_messages(client: TestClient, threads: Threads) -> None:
    response = client.post("/v1/runs", json={"agent": "api_greeter", "message": "hello?"}, headers=AUTH)
    assert response.status_code == 202
    started = response.json()
    assert set(started) == {"run_id", "thread_id", "status"} and started["status"] == "queued"
    assert response.headers["location"] == f"/v1/runs/{started['run_id']}"

    threads.wait(started["run_id"], 20)
    run = client.get(f"/v1/runs/{started['run_id']}", headers=AUTH).json()
    assert (run["id"], run["thread_id"], run["agent"]) == (started["run_id"], started["thread_id"], "api_greeter")
    assert (run["status"], run["input"], run["output"]) == ("completed", "hello?", "Hello from the API.")
    assert "fence" not in run and "lease_owner" not in run  # internals stay inside

    listed = client.get("/v1/runs", params={"thread_id": started["thread_id"]}, headers=AUTH).json()
    assert [r["id"] for r in listed] == [started["run_id"]]
    completed = client.get("/v1/runs", params={"status": "completed", "limit": 1000}, headers=AUTH).json()
    assert started["run_id"] in [r["id"] for r in completed]
    assert {r["status"] for r in completed} == {"completed"}
    aborted = client.get("/v1/runs", params={"status": "aborted"}, headers=AUTH).json()
    assert started["run_id"] not in [r["id"] for r in aborted]

    messages = client.get(f"/v1/threads/{started['thread_id']}/messages", headers=AUTH).json()
    assert [(m["seq"], m["role"], m["text"]) for m in messages] == [
        (0, "user", "hello?"),
        (1, "assistant", "Hello from the API."),
    ]
    later = client.get(f"/v1/threads/{started['thread_id']}/messages", params={"after": 0}, headers=AUTH).json()
    assert [m["seq"] for m in later] == [1]


def test_a_second_message_continues_the_thread_and_a_run_id_is_idempotent(client: TestClient, threads: Threads) -> None:
    first = start(client, "api_greeter", "one", run_id="run_client_chosen_1")
    assert first["run_id"] == "run_client_chosen_1"
    again = start(client, "api_greeter", "one", run_id="run_client_chosen_1")
    assert again["run_id"] == first["run_id"] and again["thread_id"] == first["thread_id"]
    threads.wait(first["run_id"], 20)
    second = start(client, "api_greeter", "two", thread_id=first["thread_id"])
    threads.wait(second["run_id"], 20)
    texts = [m["text"] for m in client.get(f"/v1/threads/{first['thread_id']}/messages", headers=AUTH).json()]
    assert texts == ["one", "Hello from the API.", "two", "Hello from the API."]
    # A thread belongs to its agent.
    assert_error(
        client.post(
            "/v1/runs", json={"agent": "api_mailer", "message": "x", "thread_id": first["thread_id"]}, headers=AUTH
        ),
        409,
        "conflict",
    )


def test_unknown_agent_run_thread_and_call_are_404(client: TestClient) -> None:
    assert_error(
        client.post("/v1/runs", json={"agent": "no_such_agent", "message": "x"}, headers=AUTH), 404, "unknown_agent"
    )
    assert_error(client.get("/v1/runs/run_nope", headers=AUTH), 404, "run_not_found")
    assert_error(client.post("/v1/runs/run_nope/cancel", headers=AUTH), 404, "run_not_found")
    assert_error(client.get("/v1/threads/thread_nope/messages", headers=AUTH), 404, "thread_not_found")
    assert_error(client.get("/v1/threads/thread_nope/events", headers=AUTH), 404, "thread_not_found")
    for action, body in (
        ("approve", {"principal": "ops"}),
        ("deny", {"reason": "no"}),
        ("resolve", {"resolution": "assume_done", "principal": "ops"}),
    ):
        assert_error(client.post(f"/v1/calls/run_nope:0:0/{action}", json=body, headers=AUTH), 404, "call_not_found")
    assert_error(client.get("/v1/no-such-route", headers=AUTH), 404, "not_found")


def test_cancel_aborts_a_waiting_run_and_leaves_an_ended_one_alone(client: TestClient, threads: Threads) -> None:
    started, key = awaiting_approval(client, threads)
    response = client.post(f"/v1/runs/{started['run_id']}/cancel", headers=AUTH)
    assert response.status_code == 200 and response.json()["status"] == "aborted"
    again = client.post(f"/v1/runs/{started['run_id']}/cancel", headers=AUTH)
    assert again.status_code == 200 and again.json() == response.json()
    # Its call can no longer be approved: the run ended.
    assert_error(
        client.post(f"/v1/calls/{key}/approve", json={"principal": "ops"}, headers=AUTH), 409, "call_state_conflict"
    )
    assert threads.get_run(started["run_id"]).status == "aborted"


# -- the event stream --------------------------------------------------------------------------


def test_event_stream_replays_then_tails_live_each_event_once_in_order(client: TestClient, threads: Threads) -> None:
    started, key = awaiting_approval(client, threads)
    url = f"/v1/threads/{started['thread_id']}/events"
    with client.stream("GET", url, headers=AUTH) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        replayed = read_frames(lines, until=run_status_is("awaiting_approval"))
        # Everything after this point happens while the stream is open.
        approved = client.post(f"/v1/calls/{key}/approve", json={"principal": "ops@example.com"}, headers=AUTH)
        assert approved.status_code == 200 and approved.json() == {"effect_key": key, "decision": "approved"}
        live = read_frames(lines, until=run_status_is("completed", "error", "aborted"))
    frames = replayed + live
    logged = list(threads.events(started["thread_id"]))
    assert [f.id for f in frames] == [e.seq for e in logged] == list(range(1, len(logged) + 1))
    assert [f.event for f in frames] == [e.type for e in logged]
    assert [f.data["payload"] for f in frames] == [e.payload for e in logged]
    assert all(f.data["seq"] == f.id and f.data["thread_id"] == started["thread_id"] for f in frames)
    assert live and live[-1].data["payload"]["status"] == "completed"
    assert any(f.event == "message" and f.data["payload"]["role"] == "tool" for f in live)


def test_resume_with_last_event_id_or_after_sends_only_the_rest(client: TestClient, threads: Threads) -> None:
    started = start(client, "api_greeter", "resume me")
    threads.wait(started["run_id"], 20)
    last = max(e.seq for e in threads.events(started["thread_id"]))
    url = f"/v1/threads/{started['thread_id']}/events"
    with client.stream("GET", url, headers={**AUTH, "Last-Event-ID": "2"}) as stream:
        frames = read_frames(stream.iter_lines(), until=lambda f: f.id == last)
    assert [f.id for f in frames] == list(range(3, last + 1))
    with client.stream("GET", url, params={"after": last - 1}, headers=AUTH) as stream:
        assert [f.id for f in read_frames(stream.iter_lines(), until=lambda f: f.id == last)] == [last]
    # Last-Event-ID (what a reconnecting browser sends) wins over ?after=.
    with client.stream("GET", url, params={"after": 1}, headers={**AUTH, "Last-Event-ID": str(last - 1)}) as stream:
        assert [f.id for f in read_frames(stream.iter_lines(), until=lambda f: f.id == last)] == [last]


def test_a_cursor_from_the_future_or_not_a_number_is_400(client: TestClient, threads: Threads) -> None:
    started = start(client, "api_greeter", "future")
    threads.wait(started["run_id"], 20)
    last = max(e.seq for e in threads.events(started["thread_id"]))
    url = f"/v1/threads/{started['thread_id']}/events"
    error = assert_error(client.get(url, headers={**AUTH, "Last-Event-ID": str(last + 1)}), 400, "cursor_out_of_range")
    assert str(last) in error["message"]
    assert_error(client.get(url, params={"after": last + 50}, headers=AUTH), 400, "cursor_out_of_range")
    assert_error(client.get(url, headers={**AUTH, "Last-Event-ID": "abc"}), 400, "invalid_cursor")
    assert_error(client.get(url, params={"after": -1}, headers=AUTH), 422, "validation_error")


# -- people ------------------------------------------------------------------------------------


def test_approve_runs_the_call_and_a_second_approval_is_409(client: TestClient, threads: Threads) -> None:
    started, key = awaiting_approval(client, threads)
    response = client.post(f"/v1/calls/{key}/approve", json={"principal": "ops@example.com"}, headers=AUTH)
    assert response.json() == {"effect_key": key, "decision": "approved"}
    run = threads.wait(started["run_id"], 20)
    assert (run.status, run.output) == ("completed", "Sent.")
    assert_error(
        client.post(f"/v1/calls/{key}/approve", json={"principal": "ops"}, headers=AUTH), 409, "call_state_conflict"
    )
    assert_error(
        client.post(f"/v1/calls/{key}/deny", json={"reason": "late"}, headers=AUTH), 409, "call_state_conflict"
    )


def test_approve_with_edited_arguments_validates_them(client: TestClient, threads: Threads) -> None:
    started, key = awaiting_approval(client, threads)
    bad = client.post(
        f"/v1/calls/{key}/approve", json={"principal": "ops", "override_args": {"to": "x", "cc": "nope"}}, headers=AUTH
    )
    assert "override arguments" in assert_error(bad, 422, "invalid_arguments")["message"]
    assert threads.get_run(started["run_id"]).status == "awaiting_approval"  # nothing changed
    good = client.post(
        f"/v1/calls/{key}/approve", json={"principal": "ops", "override_args": {"to": "bob@example.com"}}, headers=AUTH
    )
    assert good.status_code == 200
    assert threads.wait(started["run_id"], 20).status == "completed"
    with SENT_LOCK:
        assert "bob@example.com" in SENT


def test_a_childs_pending_call_is_listed_at_the_parent_run_and_approved_through_the_api(
    client: TestClient, threads: Threads
) -> None:
    started = start(client, "api_delegator", "delegate")

    def child_entry() -> list[dict[str, Any]]:
        response = client.get(f"/v1/runs/{started['run_id']}/pending", headers=AUTH)
        assert response.status_code == 200, response.text
        return [p for p in response.json() if p["kind"] == "child"]

    [entry] = eventually(child_entry, timeout=20, what="the child's call showing at the parent")
    assert (entry["tool"], entry["agent"], entry["status"]) == ("send_email", "api_child_mailer", "awaiting_approval")
    assert entry["via"].startswith("agent-tool:")
    approved = client.post(
        f"/v1/calls/{entry['effect_key']}/approve", json={"principal": "ops", "remember": True}, headers=AUTH
    )
    assert approved.json() == {"effect_key": entry["effect_key"], "decision": "approved"}
    assert threads.wait(started["run_id"], 20).status == "completed"
    assert [g.tool for g in threads.permission_grants(entry["thread_id"])] == ["send_email"]
    assert client.get(f"/v1/runs/{started['run_id']}/pending", headers=AUTH).json() == []


def test_pending_of_an_unknown_run_is_404_and_remember_must_be_a_bool(client: TestClient, threads: Threads) -> None:
    assert_error(client.get("/v1/runs/run_nope/pending", headers=AUTH), 404, "run_not_found")
    started, key = awaiting_approval(client, threads)
    bad = client.post(f"/v1/calls/{key}/approve", json={"principal": "ops", "remember": "always"}, headers=AUTH)
    assert bad.status_code == 422 and "always" not in bad.text
    assert threads.get_run(started["run_id"]).status == "awaiting_approval"
    client.post(f"/v1/calls/{key}/deny", json={"reason": "cleanup"}, headers=AUTH)


def test_deny_shows_the_model_the_reason(client: TestClient, threads: Threads) -> None:
    started, key = awaiting_approval(client, threads)
    assert_error(client.post(f"/v1/calls/{key}/deny", json={}, headers=AUTH), 422, "validation_error")
    assert_error(
        client.post(f"/v1/calls/{key}/resolve", json={"resolution": "assume_done", "principal": "ops"}, headers=AUTH),
        409,
        "call_state_conflict",
    )
    response = client.post(
        f"/v1/calls/{key}/deny", json={"reason": "no mail on Sundays", "principal": "ops"}, headers=AUTH
    )
    assert response.json() == {"effect_key": key, "decision": "denied"}
    run = threads.wait(started["run_id"], 20)
    assert run.status == "completed"
    tool_texts = [
        m["text"]
        for m in client.get(f"/v1/threads/{run.thread_id}/messages", headers=AUTH).json()
        if m["role"] == "tool"
    ]
    assert tool_texts == ["denied: no mail on Sundays"]


def _park(client: TestClient, threads: Threads) -> tuple[dict[str, Any], str]:
    """A mailer call whose worker died mid-call: claim recorded, lease expired, redelivered, parked."""
    started, key = awaiting_approval(client, threads)
    past = utcnow() - timedelta(seconds=5)
    with threads.store.transaction() as tx:
        tx.conn.execute(
            update(tool_calls)
            .where(tool_calls.c.effect_key == key)
            .values(status="started", attempt=1, first_started_at=past, lease_expires_at=past, approved_args_hash=None)
        )
        tx.conn.execute(update(runs_table).where(runs_table.c.id == started["run_id"]).values(status="running"))
    assert threads.app.threads_runtime.get().run_tool(key).startswith("parked")  # type: ignore[attr-defined]
    return started, key


def test_resolve_settles_a_parked_call(client: TestClient, threads: Threads) -> None:
    started, key = _park(client, threads)
    [pending] = [p for p in client.get("/v1/parked", headers=AUTH).json() if p["effect_key"] == key]
    assert pending["status"] == "parked" and pending["attempt"] == 1
    assert_error(
        client.post(f"/v1/calls/{key}/resolve", json={"resolution": "maybe", "principal": "ann"}, headers=AUTH),
        422,
        "validation_error",
    )
    assert_error(
        client.post(f"/v1/calls/{key}/resolve", json={"resolution": "assume_done", "principal": ""}, headers=AUTH),
        422,
        "validation_error",
    )
    assert_error(
        client.post(f"/v1/calls/{key}/approve", json={"principal": "ann"}, headers=AUTH), 409, "call_state_conflict"
    )
    body = {"resolution": "assume_done", "principal": "ann", "result": {"message_id": "m-1"}}
    response = client.post(f"/v1/calls/{key}/resolve", json=body, headers=AUTH)
    assert response.json() == {"effect_key": key, "decision": "assume_done"}
    run = threads.wait(started["run_id"], 20)
    assert run.status == "completed"
    tool_texts = [m.text for m in threads.messages(run.thread_id) if m.role == "tool"]
    assert tool_texts == ['{"message_id":"m-1"}']
    assert_error(client.post(f"/v1/calls/{key}/resolve", json=body, headers=AUTH), 409, "call_state_conflict")


# -- auth, limits, validation ------------------------------------------------------------------


def test_missing_or_wrong_token_is_401_and_health_is_open(client: TestClient) -> None:
    missing = client.get("/v1/runs")
    assert_error(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = client.get("/v1/runs", headers={"Authorization": "Bearer not-the-token"})
    assert_error(wrong, 401, "unauthorized")
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert_error(client.get("/v1/runs", headers={"Authorization": f"Basic {TOKEN}"}), 401, "unauthorized")
    assert_error(client.post("/v1/runs", json={"agent": "api_greeter", "message": "x"}), 401, "unauthorized")
    assert client.get("/v1/runs", headers={"Authorization": "Bearer another-token"}).status_code == 200
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
    assert client.get("/readyz").status_code == 200


def test_no_token_configured_refuses_to_start_unless_auth_is_off_explicitly(threads: Threads) -> None:
    with pytest.raises(ConfigError, match="THREADS_API_TOKENS"):
        create_api(threads, env={})
    with pytest.raises(ConfigError, match="THREADS_API_TOKENS"):
        create_api(threads, tokens=set(), env={"THREADS_API_AUTH": "on"})
    with pytest.raises(ConfigError, match="THREADS_API_AUTH"):
        create_api(threads, env={"THREADS_API_AUTH": "maybe"})
    from_env = create_api(threads, env={"THREADS_API_TOKENS": " a , b "})
    with TestClient(from_env) as c:
        assert c.get("/v1/parked", headers={"Authorization": "Bearer b"}).status_code == 200
        assert c.get("/v1/parked").status_code == 401
    open_api = create_api(threads, env={"THREADS_API_AUTH": "off"})
    with TestClient(open_api) as c:
        assert c.get("/v1/parked").status_code == 200


def test_a_body_over_the_limit_is_413_whether_declared_or_streamed(threads: Threads) -> None:
    app = create_api(threads, tokens={TOKEN}, max_body_bytes=2_000)
    with TestClient(app) as c:
        small = c.post("/v1/runs", json={"agent": "api_greeter", "message": "x" * 1_000}, headers=AUTH)
        assert small.status_code == 202
        declared = c.post("/v1/runs", json={"agent": "api_greeter", "message": "x" * 5_000}, headers=AUTH)
        assert "2000 bytes" in assert_error(declared, 413, "payload_too_large")["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies as it streams in
            yield b'{"agent": "api_greeter", "message": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        streamed = c.post("/v1/runs", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
        assert_error(streamed, 413, "payload_too_large")


def test_a_message_over_the_runtime_limit_is_413(client: TestClient, threads: Threads) -> None:
    too_long = "z" * (threads.settings.max_message_bytes + 1)
    response = client.post("/v1/runs", json={"agent": "api_greeter", "message": too_long}, headers=AUTH)
    assert "over the limit" in assert_error(response, 413, "payload_too_large")["message"]


def test_malformed_or_mistyped_bodies_are_422_without_echoing_the_input(client: TestClient) -> None:
    malformed = client.post(
        "/v1/runs",
        content=b'{"agent": "api_greeter", "message": ',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert "not valid JSON" in assert_error(malformed, 422, "validation_error")["message"]
    wrong_type = assert_error(
        client.post("/v1/runs", json={"agent": 5, "message": ["x"]}, headers=AUTH), 422, "validation_error"
    )
    assert {tuple(d["loc"]) for d in wrong_type["details"]} == {("body", "agent"), ("body", "message")}
    secret = "sk-live-do-not-echo-1234"
    extra = client.post("/v1/runs", json={"agent": "api_greeter", "message": "x", "api_key": secret}, headers=AUTH)
    assert "api_key" in assert_error(extra, 422, "validation_error")["message"]
    assert secret not in extra.text
    missing = assert_error(
        client.post("/v1/runs", json={"agent": "api_greeter"}, headers=AUTH), 422, "validation_error"
    )
    assert "message" in missing["message"]
    assert_error(
        client.post("/v1/runs", json={"agent": "api_greeter", "message": "x", "thread_id": "../etc"}, headers=AUTH),
        422,
        "validation_error",
    )
    assert_error(
        client.post("/v1/runs", json={"agent": "api_greeter", "message": "nul\x00"}, headers=AUTH),
        422,
        "validation_error",
    )
    assert_error(client.get("/v1/runs", params={"status": "sleeping"}, headers=AUTH), 422, "validation_error")
    assert_error(client.get("/v1/runs", params={"limit": 0}, headers=AUTH), 422, "validation_error")


# -- readiness and failures --------------------------------------------------------------------


def test_readyz_says_which_service_is_down(
    client: TestClient, threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert client.get("/readyz").json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok"},
        "workers": ["in-process"],  # the embedded worker, started with the first run
    }
    one = client.get("/readyz", params={"worker": 1}).json()
    assert one["checks"]["workers"] == "ok" and one["workers"] == ["in-process"]
    assert client.get("/readyz", params={"worker": 2}).status_code == 503

    def broker_down(*_: Any, **__: Any) -> None:
        raise BrokerUnavailable("cannot reach the broker at redis://:hunter2@10.0.0.9:6379/0")

    monkeypatch.setattr(threads.publisher, "check", broker_down)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"] == {"database": "ok", "broker": "unavailable"}
    assert body["error"]["type"] == "not_ready" and "broker" in body["error"]["message"]
    assert "hunter2" not in response.text

    def store_down() -> None:
        raise StoreUnavailable("cannot reach the database")

    monkeypatch.setattr(threads.store, "ping", store_down)
    body = client.get("/readyz").json()
    assert body["checks"] == {"database": "unavailable", "broker": "unavailable"}
    assert client.get("/healthz").status_code == 200  # the process is still up


def test_service_and_unexpected_failures_carry_no_secret_and_no_trace(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_api(threads, tokens={TOKEN})
    with TestClient(app, raise_server_exceptions=False) as c:

        def store_down(**_: Any) -> None:
            raise StoreUnavailable("cannot reach the database at postgresql://app:hunter2@db/threads")

        monkeypatch.setattr(threads, "runs", store_down)
        down = c.get("/v1/runs", headers=AUTH)
        assert_error(down, 503, "store_unavailable")
        assert "hunter2" not in down.text and "postgresql" not in down.text

        def broken() -> None:
            raise RuntimeError("secret-token-in-a-bug")

        monkeypatch.setattr(threads, "parked", broken)
        crashed = c.get("/v1/parked", headers=AUTH)
        assert_error(crashed, 500, "internal_error")
        assert "secret-token-in-a-bug" not in crashed.text and "RuntimeError" not in crashed.text


def test_openapi_documents_every_route_and_the_bearer_scheme(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {
        "/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/cancel", "/v1/threads/{thread_id}/messages",
        "/v1/threads/{thread_id}/events", "/v1/parked", "/v1/calls/{effect_key}/approve",
        "/v1/calls/{effect_key}/deny", "/v1/calls/{effect_key}/resolve", "/healthz", "/readyz",
    } <= set(spec["paths"])  # fmt: skip
    schemes = spec["components"]["securitySchemes"]
    assert [s["scheme"].lower() for s in schemes.values()] == ["bearer"]
    assert spec["paths"]["/v1/runs"]["post"]["security"] and "security" not in spec["paths"]["/healthz"]["get"]
    assert spec["components"]["schemas"]["StartRun"]["additionalProperties"] is False


# -- the command -------------------------------------------------------------------------------


def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_")}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **extra)
    return env


def test_the_api_command_refuses_to_start_without_tokens(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "threads_celery.cli.app", "api", "--port", "1"],
        cwd=tmp_path, env=_cli_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "THREADS_API_TOKENS" in result.stderr and "Traceback" not in result.stderr


def test_the_api_command_serves_the_api(tmp_path: Path) -> None:
    port = free_port()
    env = _cli_env(THREADS_API_TOKENS="cli-token", THREADS_AGENTS="examples.demo")
    proc = ManagedProcess(
        "api",
        [THREADS_CELERY, "api", "--embedded", "--port", str(port)],
        env=env,
        log_path=tmp_path / "api.log",
        cwd=tmp_path,
    )
    proc.start()
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.alive(), proc.log_text()
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                    assert json.loads(response.read()) == {"status": "ok", "checks": {}}
                    return True
            except OSError:
                return False

        eventually(healthy, timeout=STREAM_DEADLINE_S, what="the API answering", detail=proc.log_tail)
        request = urllib.request.Request(
            f"{base}/v1/runs",
            data=json.dumps({"agent": "trip-planner", "message": "plan a dinner in Rome"}).encode(),
            headers={"Authorization": "Bearer cli-token", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 202
            run_id = json.loads(response.read())["run_id"]
        read = urllib.request.Request(f"{base}/v1/runs/{run_id}", headers={"Authorization": "Bearer cli-token"})
        with urllib.request.urlopen(read, timeout=10) as response:
            assert json.loads(response.read())["agent"] == "trip-planner"
        with pytest.raises(urllib.error.HTTPError) as unauthorized:
            urllib.request.urlopen(f"{base}/v1/runs", timeout=10)
        assert unauthorized.value.code == 401
    finally:
        proc.terminate(timeout=20)


# -- fuzzing -----------------------------------------------------------------------------------
#
# Schemathesis generates requests from /openapi.json, valid ones and ones the schema forbids, and
# none may end in a 5xx. Its pytest integration (``from_fixture``) fails on pytest 9, so the
# operations' strategies are driven by Hypothesis directly, inside an ordinary test.


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_request_the_schema_allows_or_forbids_is_a_server_error(client: TestClient, mode: str) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    # The SSE streams (a thread's, a child's drill-in) never end by design; they have their own tests.
    fuzzed = [op for op in operations if not op.path.endswith("/events")]
    assert len(fuzzed) == len(operations) - 2 >= 10
    calls: dict[str, int] = {}
    for operation in fuzzed:

        @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode)))
        @settings(
            max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
        )
        def no_server_error(case: Any) -> None:
            # Called right below, within this iteration: the loop variable is the current one.
            calls[operation.label] = calls.get(operation.label, 0) + 1  # noqa: B023
            if case.path == "/readyz":
                # Not ready is a 503 by design (more workers asked for than there are): only that.
                response = case.call(headers=AUTH)
                if response.status_code == 503:
                    assert response.json()["error"]["type"] == "not_ready", response.text
                else:
                    assert response.status_code < 500, response.text
                return
            case.call_and_validate(headers=AUTH, checks=[not_a_server_error])

        try:
            no_server_error()
        except Unsatisfiable:
            # Only an operation with nothing to get wrong (no parameter, no body) has no negative case.
            assert mode == "negative" and "{" not in operation.path and operation.method.upper() == "GET", (
                operation.label
            )
    with_inputs = {op.label for op in fuzzed if "{" in op.path or op.method.upper() == "POST"}
    assert with_inputs <= {label for label, n in calls.items() if n > 0}
