"""The /v1 branch routes over HTTP: rewind, fork, regenerate, edit and the branches of a thread.

One embedded runtime serves the module; the scripted model numbers its answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from threads_celery import Agent, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

TOKEN = "branches-token-0123456789"
OTHER = "eve@globex=branches-token-globex"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OTHER_AUTH = {"Authorization": "Bearer branches-token-globex"}
WAIT_S = 30.0
answers: list[str] = []


def _numbered(messages: list[Any]) -> str:
    answers.append(f"answer {len(answers) + 1}")
    return answers[-1]


class EmailIn(BaseModel):
    to: str


send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=lambda inp, ctx: "sent")
talker = Agent(name="api_branch_talker", instructions="Talk.", model=ScriptedModel([_numbered]))
mailer = Agent(
    name="api_branch_mailer",
    instructions="Mail.",
    model=ScriptedModel([call("send_email", to="ann@example.com"), say("Done.")]),
    tools=[send_email],
)


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded() as runtime:
        for agent in (talker, mailer):
            runtime.register(agent)
        yield runtime


@pytest.fixture(scope="module")
def client(threads: Threads) -> Iterator[TestClient]:
    with TestClient(create_api(threads, tokens=[TOKEN, OTHER], keepalive_s=5, poll_interval_s=0.02)) as test_client:
        yield test_client


def conversation(client: TestClient, threads: Threads, *texts: str, agent: str = "api_branch_talker") -> str:
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    for text in texts:
        body = {"agent": agent, "message": text, "thread_id": thread_id}
        started = client.post("/v1/runs", json=body, headers=AUTH)
        assert started.status_code in (200, 201, 202), started.text
        threads.wait(started.json()["run_id"], WAIT_S)
    return thread_id


def messages(client: TestClient, thread_id: str, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"/v1/threads/{thread_id}/messages", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return list(response.json())


def error_type(response: Any) -> str:
    return str(response.json()["error"]["type"])


def test_rewind_keeps_what_followed_as_a_superseded_branch(client: TestClient, threads: Threads) -> None:
    thread_id = conversation(client, threads, "one", "two")
    before = messages(client, thread_id)
    response = client.post(f"/v1/threads/{thread_id}/rewind", json={"at": before[1]["seq"]}, headers=AUTH)
    assert response.status_code == 200, response.text
    branch = response.json()
    assert branch["kind"] == "rewind" and branch["from_seq"] == before[2]["seq"] and branch["created_by"]
    assert [m["text"] for m in messages(client, thread_id)] == ["one", before[1]["text"]]
    everything = messages(client, thread_id, include_superseded="true")
    assert [m["superseded_by"] for m in everything] == [None, None, branch["id"], branch["id"]]
    listed = client.get(f"/v1/threads/{thread_id}/branches", headers=AUTH).json()
    assert [b["id"] for b in listed] == [branch["id"]]
    # Nothing follows the last message: nothing changes.
    again = client.post(f"/v1/threads/{thread_id}/rewind", json={"at": before[1]["seq"]}, headers=AUTH)
    assert again.status_code == 204


def test_fork_regenerate_and_edit(client: TestClient, threads: Threads) -> None:
    thread_id = conversation(client, threads, "one", "two")
    before = messages(client, thread_id)
    body = {"at": before[1]["seq"], "thread_id": f"fork-{uuid.uuid4().hex[:6]}"}
    forked = client.post(f"/v1/threads/{thread_id}/fork", json=body, headers=AUTH)
    assert forked.status_code == 201, forked.text
    assert forked.json()["thread_id"] == body["thread_id"] and forked.json()["source_thread_id"] == thread_id
    assert [m["text"] for m in messages(client, body["thread_id"])] == ["one", before[1]["text"]]
    assert messages(client, thread_id) == before
    # The same id again is a clash, not a second fork.
    assert client.post(f"/v1/threads/{thread_id}/fork", json=body, headers=AUTH).status_code == 409
    regenerated = client.post(f"/v1/threads/{thread_id}/regenerate", json={}, headers=AUTH)
    assert regenerated.status_code == 201, regenerated.text
    threads.wait(regenerated.json()["id"], WAIT_S)
    texts = [m["text"] for m in messages(client, thread_id)]
    assert texts[:3] == ["one", before[1]["text"], "two"] and texts[3] not in (before[3]["text"],)
    first_run = before[0]["run_id"]
    edited = client.post(f"/v1/threads/{thread_id}/edit", json={"run_id": first_run, "text": "uno"}, headers=AUTH)
    assert edited.status_code == 201, edited.text
    threads.wait(edited.json()["id"], WAIT_S)
    assert messages(client, thread_id)[0]["text"] == "uno"
    kinds = [b["kind"] for b in client.get(f"/v1/threads/{thread_id}/branches", headers=AUTH).json()]
    assert kinds == ["regenerate", "edit"]


def test_bad_branch_requests_get_clear_errors_and_change_nothing(client: TestClient, threads: Threads) -> None:
    thread_id = conversation(client, threads, "one")
    before = messages(client, thread_id)
    post = lambda path, body, headers=AUTH: client.post(f"/v1/threads/{thread_id}/{path}", json=body, headers=headers)  # noqa: E731
    assert error_type(post("rewind", {"at": 99})) == "message_not_found"
    assert post("rewind", {"at": -1}).status_code == 422
    assert post("rewind", {"at": "x"}).status_code == 422
    assert post("rewind", {"at": 0, "extra": 1}).status_code == 422
    assert post("edit", {"run_id": before[0]["run_id"], "text": "a\x00b"}).status_code == 422
    assert post("edit", {"run_id": "no-such-run", "text": "x"}).status_code == 404
    assert post("fork", {"at": 0, "thread_id": "bad id!"}).status_code == 422
    # Another tenant's thread is not there for the caller.
    assert post("rewind", {"at": 0}, OTHER_AUTH).status_code == 404
    assert post("fork", {"at": 0}, OTHER_AUTH).status_code == 404
    assert client.get(f"/v1/threads/{thread_id}/branches", headers=OTHER_AUTH).status_code == 404
    assert messages(client, thread_id) == before and threads.branches(thread_id) == []


def test_a_thread_with_a_run_waiting_cannot_branch_in_place(client: TestClient, threads: Threads) -> None:
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    started = client.post(
        "/v1/runs", json={"agent": "api_branch_mailer", "message": "mail", "thread_id": thread_id}, headers=AUTH
    )
    run = threads.wait(started.json()["run_id"], WAIT_S)
    assert run.status == "awaiting_approval"
    for path, body in (
        ("rewind", {"at": 0}),
        ("regenerate", {}),
        ("edit", {"run_id": started.json()["run_id"], "text": "x"}),
    ):
        refused = client.post(f"/v1/threads/{thread_id}/{path}", json=body, headers=AUTH)
        assert refused.status_code == 409 and error_type(refused) == "thread_busy", refused.text
    # A fork leaves the source alone, so it may be taken now; the waiting call is not copied.
    forked = client.post(f"/v1/threads/{thread_id}/fork", json={"at": 1}, headers=AUTH)
    assert forked.status_code == 201, forked.text
    assert len(forked.json()["dropped_calls"]) == 1
    assert threads.get_run(run.id).status == "awaiting_approval"
