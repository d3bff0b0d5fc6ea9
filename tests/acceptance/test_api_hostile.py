"""Hostile HTTP input answers 4xx, and what the API says is true, on SQLite and PostgreSQL.

A web app's view of the API (FastAPI's TestClient) over a runtime with a real in-process Celery
worker, once over a SQLite file and once over a fresh PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from threads_celery import Agent, Settings, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import Reply, ScriptedModel, call, say

TOKEN = "hostile-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE_S = 30.0


class EmailIn(BaseModel):
    to: str


def _send(inp: EmailIn, ctx: Any) -> str:
    return f"sent to {inp.to}"


def _report(inp: EmailIn, ctx: Any) -> str:
    return "r" * 300_000


report = tool(name="report", description="A long report.", input=EmailIn, effect="read_only", execute=_report)
reporter = Agent(
    name="reporter",
    instructions="Report.",
    model=ScriptedModel([call("report", to="x"), say("Reported.")]),
    tools=[report],
)
send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=_send)
# The model writes text before its call: the text is part 0 of the stream, the call part 1.
chatty_mailer = Agent(
    name="chatty_mailer",
    instructions="Send what you are asked to.",
    model=ScriptedModel(
        [Reply(text="Sure, sending it now.", calls=(("send_email", '{"to": "ann@example.com"}'),)), say("Sent.")]
    ),
    tools=[send_email],
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def threads(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'ledger.db'}"
    else:
        url = request.getfixturevalue("pg_url_module")
    runtime = Threads(database_url=url, broker_url="memory://", settings=Settings(), migrate=True, worker_concurrency=2)
    runtime.register(chatty_mailer)
    runtime.register(reporter)
    runtime.start_worker(reconcile_interval=0.5)
    try:
        yield runtime
    finally:
        runtime.stop_worker()
        runtime.close()


@pytest.fixture(scope="module")
def client(threads: Threads) -> Iterator[TestClient]:
    app = create_api(threads, tokens={TOKEN}, keepalive_s=0.2, poll_interval_s=0.02)
    with TestClient(app) as test_client:
        yield test_client


def start(client: TestClient, agent: str = "chatty_mailer", message: str = "mail ann") -> dict[str, Any]:
    response = client.post("/v1/runs", json={"agent": agent, "message": message}, headers=AUTH)
    assert response.status_code == 202, response.text
    return response.json()


def read_events(client: TestClient, thread_id: str, until: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The thread's committed SSE frames (type and payload) until one satisfies ``until``."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE_S
    with client.stream("GET", f"/v1/threads/{thread_id}/events", headers=AUTH) as stream:
        assert stream.status_code == 200
        fields: dict[str, str] = {}
        for line in stream.iter_lines():
            assert time.monotonic() < deadline, f"the stream stalled after {frames}"
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "data" in fields and "id" in fields:  # a committed event (a live delta has no id)
                data = json.loads(fields["data"])
                frame = {"type": fields["event"], "payload": data["payload"]}
                frames.append(frame)
                if until(frame):
                    return frames
            fields = {}
    raise AssertionError("the stream ended")


def run_status(*statuses: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f["type"] == "run" and f["payload"].get("status") in statuses


def assert_4xx(response: Any) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert "error" in response.json()


# -- no 500 for any input ----------------------------------------------------------------------


def test_each_measured_hostile_input_is_a_4xx(client: TestClient, threads: Threads) -> None:
    started = start(client)
    assert threads.wait(started["run_id"], DEADLINE_S).status == "awaiting_approval"
    thread = started["thread_id"]
    events = f"/v1/threads/{thread}/events"
    # Headers arrive as bytes read as latin-1: b"\xb2" is "²", which str.isdigit() takes for a digit.
    for cursor in [b"\xb2", "\u0661\u0662".encode(), b"9" * 5000, str(2**31).encode(), str(2**63).encode()]:
        assert_4xx(client.get(events, headers={**AUTH, "Last-Event-ID": cursor}))  # type: ignore[dict-item]
    for after in [2**31, 2**63, 10**30]:
        assert_4xx(client.get(f"/v1/threads/{thread}/messages", params={"after": after}, headers=AUTH))
        assert_4xx(client.get(events, params={"after": after}, headers=AUTH))
    assert_4xx(client.get(f"/v1/threads/{thread}/agent-tool-runs?status=%00", headers=AUTH))
    assert_4xx(client.delete(f"/v1/threads/{thread}/agent-tool-runs?status=%00", headers=AUTH))
    assert_4xx(
        client.delete(
            f"/v1/threads/{thread}/agent-tool-runs", params={"older_than": "2026-01-01T00:00:00"}, headers=AUTH
        )
    )
    for body in [
        {"agent": "chatty\x00mailer", "message": "hi"},
        {"agent": "chatty_mailer", "message": "hi \ud800 there"},
        {"agent": "chatty_mailer", "message": "hi \x00 there"},
    ]:
        raw = json.dumps(body)  # escapes the NUL and the surrogate as JSON allows
        assert_4xx(client.post("/v1/runs", content=raw, headers={**AUTH, "Content-Type": "application/json"}))
    # A timezone-aware older_than is accepted; nothing earlier in the thread was touched.
    ok = client.delete(
        f"/v1/threads/{thread}/agent-tool-runs", params={"older_than": "2026-01-01T00:00:00Z"}, headers=AUTH
    )
    assert ok.status_code == 200, ok.text
    assert [m["role"] for m in client.get(f"/v1/threads/{thread}/messages", headers=AUTH).json()] == [
        "user",
        "assistant",
    ]


# -- state that tells the truth ----------------------------------------------------------------


def test_the_started_event_carries_the_calls_own_key_and_approving_from_it_works(
    client: TestClient, threads: Threads
) -> None:
    started = start(client)
    frames = read_events(client, started["thread_id"], until=run_status("awaiting_approval"))
    [started_event] = [f["payload"] for f in frames if f["type"] == "tool_call_started"]
    key = started_event["effect_key"]
    assert key == f"{started['run_id']}:0:0"  # the first call, though text came before it
    approved = client.post(f"/v1/calls/{key}/approve", json={"principal": "ops@example.com"}, headers=AUTH)
    assert approved.status_code == 200, approved.text
    run = threads.wait(started["run_id"], DEADLINE_S)
    assert run.status == "completed" and run.output == "Sent."
    assert [m.text for m in threads.messages(started["thread_id"]) if m.role == "tool"] == ["sent to ann@example.com"]


def test_cancelling_a_run_settles_its_pending_approvals(client: TestClient, threads: Threads) -> None:
    started = start(client)
    assert threads.wait(started["run_id"], DEADLINE_S).status == "awaiting_approval"
    [pending] = [p for p in client.get("/v1/parked", headers=AUTH).json() if p["run_id"] == started["run_id"]]
    cancelled = client.post(f"/v1/runs/{started['run_id']}/cancel", headers=AUTH)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "aborted"
    assert [p for p in client.get("/v1/parked", headers=AUTH).json() if p["run_id"] == started["run_id"]] == []
    assert [c for c in threads.parked() if c.run_id == started["run_id"]] == []
    frames = read_events(client, started["thread_id"], until=lambda f: f["type"] == "tool_call_cancelled")
    settled = frames[-1]["payload"]
    assert settled["effect_key"] == pending["effect_key"] and settled["was"] == "awaiting_approval"
    assert settled["status"] == "skipped"
    # The thread keeps a result for the call (a later run's model sees why), and the user message.
    messages = threads.messages(started["thread_id"])
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[-1].text.startswith("not run: the run was cancelled (cancelled through the HTTP API")
    # Approving it now is a conflict, not a resurrection.
    late = client.post(f"/v1/calls/{pending['effect_key']}/approve", json={"principal": "ops"}, headers=AUTH)
    assert late.status_code == 409


def test_a_shortened_result_is_fetched_whole_over_http(client: TestClient, threads: Threads) -> None:
    started = start(client, "reporter", "report")
    assert threads.wait(started["run_id"], DEADLINE_S).status == "completed"
    [assistant] = [
        m
        for m in client.get(f"/v1/threads/{started['thread_id']}/messages", headers=AUTH).json()
        if m["role"] == "assistant" and m["tool_calls"]
    ]
    key = assistant["tool_calls"][0]["effect_key"]
    shown = next(m for m in threads.messages(started["thread_id"]) if m.role == "tool").text
    assert "[result shortened: it is 300000 bytes, over the limit of 100000;" in shown
    response = client.get(f"/v1/calls/{key}/result", headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["result"] == "r" * 300_000 and body["shortened_for_model"] is True and body["is_error"] is False
    assert client.get("/v1/calls/run_none:0:0/result", headers=AUTH).status_code == 404


# -- stateful fuzzing --------------------------------------------------------------------------
#
# Schemathesis infers links between operations (POST /v1/runs answers a run_id that GET
# /v1/runs/{run_id} takes, a thread_id that the thread routes take, and so on) and walks them as a
# Hypothesis state machine: each scenario starts runs, reads, cancels, approves and clears with
# the ids real responses gave. No step may answer 5xx. The SSE streams never end by design (they
# have their own tests) and are left out.


def test_no_sequence_of_linked_requests_is_a_server_error(client: TestClient, threads: Threads) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.errors import FlakyStrategyDefinition

    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app).exclude(path_regex=r".*/events$")
    calls: list[tuple[str, int]] = []
    server_errors: list[tuple[str, str, int, str]] = []

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            # Random agent names are all unknown (404): name a registered one, so runs start.
            if (
                case.method == "POST"
                and case.path == "/v1/runs"
                and isinstance(case.body, dict)
                and "agent" in case.body
            ):
                case.body["agent"] = "chatty_mailer"

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": AUTH}

        def validate_response(self, response: Any, case: Any, *args: Any, **kwargs: Any) -> None:
            calls.append((f"{case.method} {case.path}", response.status_code))
            if response.status_code >= 500:  # recorded, not raised: see the note on replays below
                server_errors.append((case.method, case.formatted_path, response.status_code, response.text))

    # Schemathesis learns links from live answers as it walks, so Hypothesis may find two
    # scenarios that began alike drawing differently and stop the walk there. What was
    # walked still counts: every answer was recorded above, and none may be a 5xx.
    with contextlib.suppress(FlakyStrategyDefinition):
        Workflow.run(
            settings=settings(
                max_examples=40,
                stateful_step_count=6,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
                # Generation only: the ids a step draws come from what the live API answered
                # earlier, so replaying a recorded example (or shrinking one) is not deterministic.
                phases=[Phase.generate],
            )
        )
    assert server_errors == []
    # The walk reached the routes that need an id from an earlier answer, with real ids.
    reached = {label for label, status in calls if status < 400}
    assert "POST /v1/runs" in reached, sorted(set(calls))
    assert {"GET /v1/runs/{run_id}", "POST /v1/runs/{run_id}/cancel"} & reached, sorted(set(calls))
