"""Regenerate and edit through the chat endpoints, as the AI SDK and AG-UI clients send them.

One embedded runtime (SQLite and the in-process worker) serves the module. The model numbers its
answers and records the conversation it is given, so each test compares what the client shows
after a reload with what the provider received. The real ``useChat`` in Chromium is
tests/acceptance/test_chat_pages.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from threads_celery import Agent, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

TOKEN = "branch-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
seen: list[list[tuple[str, str]]] = []


def _numbered(messages: list[ModelMessage]) -> str:
    conversation: list[tuple[str, str]] = []
    for message in messages:
        for part in message.parts:
            if isinstance(message, ModelRequest) and isinstance(part, UserPromptPart):
                conversation.append(("user", str(part.content)))
            elif isinstance(message, ModelResponse) and isinstance(part, TextPart):
                conversation.append(("assistant", part.content))
    seen.append(conversation)
    return f"answer {len(seen)}"


class EmailIn(BaseModel):
    to: str


send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=lambda inp, ctx: "sent")
talker = Agent(name="branch_talker", instructions="Talk.", model=ScriptedModel([_numbered]))
mailer = Agent(
    name="branch_mailer",
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
    app = create_api(threads, tokens=[TOKEN], keepalive_s=5, poll_interval_s=0.02)
    with TestClient(app) as test_client:
        yield test_client


def user(text: str, id: str | None = None) -> dict[str, Any]:
    return {"id": id or uuid.uuid4().hex[:12], "role": "user", "parts": [{"type": "text", "text": text}]}


def post(client: TestClient, chat_id: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    body = {"id": chat_id, "messages": messages, "trigger": "submit-message", **extra}
    return client.post("/v1/chat/vercel-ai/branch_talker", json=body, headers=AUTH)


def reply_text(response: Any) -> str:
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}, chunks[-1]
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


def history(client: TestClient, chat_id: str) -> list[tuple[str, str, str]]:
    response = client.get(f"/v1/chat/vercel-ai/branch_talker/{chat_id}/messages", headers=AUTH)
    assert response.status_code == 200, response.text
    return [
        (m["id"], m["role"], "".join(p.get("text", "") for p in m["parts"] if p["type"] == "text"))
        for m in response.json()
    ]


def test_regenerate_message_answers_the_last_message_again(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    u, a = user("first"), user("second")
    first = reply_text(post(client, chat_id, [u]))
    second = reply_text(post(client, chat_id, [u, a]))
    shown = history(client, chat_id)
    # useChat's regenerate(): the messages up to the user message, and the id of the reply it replaces.
    body = {"id": chat_id, "messages": [u, a], "trigger": "regenerate-message", "messageId": f"reply-{a['id']}"}
    again = reply_text(client.post("/v1/chat/vercel-ai/branch_talker", json=body, headers=AUTH))
    assert again not in (first, second)
    # What the provider received ends with the user's message, without the reply it replaces.
    assert seen[-1] == [("user", "first"), ("assistant", first), ("user", "second")]
    after = history(client, chat_id)
    assert [m[:2] for m in after[:3]] == [m[:2] for m in shown[:3]] and after[3][1] == "assistant"
    assert [m[2] for m in after] == ["first", first, "second", again]
    assert after[2][0] == a["id"]  # the user message keeps the client's id
    # The replaced reply is kept, as a superseded branch.
    everything = threads.messages(chat_id, include_superseded=True)
    assert [m.text for m in everything if m.superseded_by is not None] == ["second", second]


def test_an_edited_message_continues_the_chat_from_it(client: TestClient) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    u, a = user("first"), user("second")
    first = reply_text(post(client, chat_id, [u]))
    reply_text(post(client, chat_id, [u, a]))
    # useChat's sendMessage({text, messageId}): the edited message replaces the one of that id.
    edited = {**u, "parts": [{"type": "text", "text": "first, edited"}]}
    answer = reply_text(post(client, chat_id, [edited]))
    assert seen[-1] == [("user", "first, edited")]
    assert [m[1:] for m in history(client, chat_id)] == [("user", "first, edited"), ("assistant", answer)]
    assert history(client, chat_id)[0][0] == u["id"]
    assert answer != first
    # Sent again, the same edit attaches to its run: nothing is answered twice.
    before = len(seen)
    assert reply_text(post(client, chat_id, [edited])) == answer
    assert len(seen) == before
    # An edit of the edited message (still the client's id) branches again.
    twice = {**u, "parts": [{"type": "text", "text": "first, edited twice"}]}
    reply_text(post(client, chat_id, [twice]))
    assert history(client, chat_id)[0][2] == "first, edited twice"


def test_a_regenerate_while_a_run_waits_is_refused_and_changes_nothing(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    u = user("mail ann")
    body = {"id": chat_id, "messages": [u], "trigger": "submit-message"}
    response = client.post("/v1/chat/vercel-ai/branch_mailer", json=body, headers=AUTH)
    assert response.status_code == 200
    assert threads.get_run(u["id"]).status == "awaiting_approval"
    regenerate = {**body, "trigger": "regenerate-message"}
    refused = client.post("/v1/chat/vercel-ai/branch_mailer", json=regenerate, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "thread_busy", refused.text
    edited = {**body, "messages": [{**u, "parts": [{"type": "text", "text": "mail bob"}]}]}
    refused = client.post("/v1/chat/vercel-ai/branch_mailer", json=edited, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "thread_busy", refused.text
    assert threads.branches(chat_id) == [] and len(threads.runs(thread_id=chat_id)) == 1


def test_a_message_of_a_superseded_branch_is_refused(client: TestClient) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    u, a = user("first"), user("second")
    reply_text(post(client, chat_id, [u]))
    reply_text(post(client, chat_id, [u, a]))
    edited = {**u, "parts": [{"type": "text", "text": "again"}]}
    reply_text(post(client, chat_id, [edited]))
    # A stale tab still holds the message the edit left behind.
    stale = post(client, chat_id, [u, a])
    assert stale.status_code == 409 and stale.json()["error"]["type"] == "stale_branch", stale.text


def agui(client: TestClient, thread_id: str, messages: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    body = {"threadId": thread_id, "runId": uuid.uuid4().hex, "messages": messages, **extra}
    response = client.post("/v1/chat/ag-ui/branch_talker", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def agui_text(events: list[dict[str, Any]]) -> str:
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_ag_ui_regenerates_with_parent_run_id_and_echoes_it(client: TestClient, threads: Threads) -> None:
    thread_id = f"agui-{uuid.uuid4().hex[:8]}"
    u = {"id": uuid.uuid4().hex[:12], "role": "user", "content": "hello"}
    first = agui_text(agui(client, thread_id, [u]))
    # The same input again (a reconnect) attaches; with parentRunId it is answered again.
    assert agui_text(agui(client, thread_id, [u])) == first
    events = agui(client, thread_id, [u], parentRunId="run-before")
    assert events[0]["type"] == "RUN_STARTED" and events[0]["parentRunId"] == "run-before"
    again = agui_text(events)
    assert again != first and seen[-1] == [("user", "hello")]
    assert [m.text for m in threads.messages(thread_id)] == ["hello", again]
    edited = {**u, "content": "hello, edited"}
    third = agui_text(agui(client, thread_id, [edited]))
    assert [m.text for m in threads.messages(thread_id)] == ["hello, edited", third]
    assert [b.kind for b in threads.branches(thread_id)] == ["regenerate", "edit"]


def test_a_regenerate_then_an_edit_of_an_earlier_message(client: TestClient) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    u, a = user("first"), user("second")
    reply_text(post(client, chat_id, [u]))
    reply_text(post(client, chat_id, [u, a]))
    body = {"id": chat_id, "messages": [u, a], "trigger": "regenerate-message"}
    reply_text(client.post("/v1/chat/vercel-ai/branch_talker", json=body, headers=AUTH))
    edited = {**u, "parts": [{"type": "text", "text": "first, edited"}]}
    answer = reply_text(post(client, chat_id, [edited]))
    assert [m[1:] for m in history(client, chat_id)] == [("user", "first, edited"), ("assistant", answer)]
