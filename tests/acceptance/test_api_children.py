"""HTTP routes for agent-tool runs (list, clear, gated drill-in) and thread variables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import BaseModel

from tests.support.waiting import eventually
from threads_celery import Agent, Threads, Variable, agent_tool, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

TOKEN = "children-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class In(BaseModel):
    q: str


lookup = tool(
    name="lookup",
    description="x",
    input=In,
    effect="read_only",
    execute=lambda i, c: f"region={c.env('REGION')}",
    variables=[Variable("REGION", required=True)],
)
researcher = Agent(name="api-researcher", instructions="x", model=ScriptedModel([say("QUIC is UDP-based.")], per="run"))
parent = Agent(
    name="api-parent",
    instructions="x",
    tools=[agent_tool(researcher, "Research."), lookup],
    model=ScriptedModel([call("api_researcher", message="HTTP/3"), call("lookup", q="x"), say("done")]),
)


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, Threads]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())
        with (
            Threads.embedded() as threads,
            TestClient(create_api(threads, tokens={TOKEN}, keepalive_s=0.2, poll_interval_s=0.02)) as c,
        ):
            yield c, threads


def _wait(threads: Threads, run_id: str, status: str) -> None:
    eventually(
        lambda: threads.get_run(run_id).status == status,
        timeout=20,
        what=f"run {run_id} {status}",
        detail=lambda: threads.get_run(run_id).status,
    )


def test_agent_tool_runs_are_listed_drilled_into_and_cleared(client: tuple[TestClient, Threads]) -> None:
    http, threads = client
    threads.register(parent)
    run_id = http.post("/v1/runs", json={"agent": "api-parent", "message": "go"}, headers=AUTH).json()["run_id"]
    _wait(threads, run_id, "awaiting_variable")
    thread_id = threads.get_run(run_id).thread_id
    [row] = http.get(f"/v1/threads/{thread_id}/agent-tool-runs", headers=AUTH).json()
    assert (row["agent_type"], row["status"], row["summary"]) == ("api-researcher", "completed", "QUIC is UDP-based.")

    with http.stream("GET", f"/v1/threads/{thread_id}/agent-tool-runs/{row['run_id']}/events", headers=AUTH) as stream:
        assert stream.status_code == 200
        frames = []
        for line in stream.iter_lines():
            if line.startswith("data:"):
                frames.append(line)
            if '"status": "completed"' in line or '"status":"completed"' in line:
                break
    assert any("QUIC is UDP-based." in f for f in frames)

    # A guessed id is a 404, and nothing is spawned for it.
    before = len(threads.runs())
    guessed = http.get(f"/v1/threads/{thread_id}/agent-tool-runs/agent-tool:guess/events", headers=AUTH)
    assert guessed.status_code == 404 and guessed.json()["error"]["type"] == "not_found"
    assert len(threads.runs()) == before

    # The run waits for REGION: setting it through the API lets it finish.
    answer = http.post(f"/v1/threads/{thread_id}/env", json={"name": "REGION", "value": "eu"}, headers=AUTH)
    assert answer.status_code == 200 and answer.json() == {"name": "REGION", "resumed_calls": 1}
    _wait(threads, run_id, "completed")
    assert [m.text for m in threads.messages(thread_id) if m.role == "tool"][-1] == "region=eu"

    cleared = http.delete(f"/v1/threads/{thread_id}/agent-tool-runs", headers=AUTH)
    assert cleared.status_code == 200 and cleared.json() == {"cleared": 1}
    assert http.get(f"/v1/threads/{thread_id}/agent-tool-runs", headers=AUTH).json() == []


def test_unknown_threads_and_bad_bodies_are_clear_errors(client: tuple[TestClient, Threads]) -> None:
    http, _ = client
    assert http.get("/v1/threads/nope/agent-tool-runs", headers=AUTH).status_code == 404
    bad = http.post("/v1/threads/nope/env", json={"name": "REGION", "value": "x", "extra": 1}, headers=AUTH)
    assert bad.status_code == 422
    assert http.get("/v1/threads/nope/agent-tool-runs").status_code == 401
