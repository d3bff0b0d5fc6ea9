"""The chat protocols on the HTTP API: the AI SDK's UI message stream and AG-UI, read as a client reads them.

One embedded runtime (SQLite and the in-process worker) serves the module; the agents are
scripted. The browser pages that drive the real npm clients are tests/acceptance/test_chat_pages.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from threads_celery import Agent, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

TOKEN = "chat-token-0123456789"
OTHER = "bob@globex=chat-token-globex"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OTHER_AUTH = {"Authorization": "Bearer chat-token-globex"}


class LookupIn(BaseModel):
    city: str


class EmailIn(BaseModel):
    to: str


def _lookup(inp: LookupIn, ctx: Any) -> str:
    return f"21 degrees in {inp.city}"


def _send(inp: EmailIn, ctx: Any) -> str:
    return f"sent to {inp.to}"


lookup = tool(name="weather", description="The weather.", input=LookupIn, execute=_lookup, effect="read_only")
send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=_send)
greeter = Agent(name="chat_greeter", instructions="Greet.", model=ScriptedModel([say("Hello from the chat.")]))
weather = Agent(
    name="chat_weather",
    instructions="Answer.",
    model=ScriptedModel([call("weather", city="Paris"), say("It is 21 degrees in Paris.")]),
    tools=[lookup],
)
mailer = Agent(
    name="chat_mailer",
    instructions="Mail.",
    model=ScriptedModel([call("send_email", to="ann@example.com"), say("Done.")]),
    tools=[send_email],
)


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded() as runtime:
        for agent in (greeter, weather, mailer):
            runtime.register(agent)
        yield runtime


@pytest.fixture(scope="module")
def client(threads: Threads) -> Iterator[TestClient]:
    app = create_api(threads, tokens=[TOKEN, OTHER], keepalive_s=5, poll_interval_s=0.02)
    with TestClient(app) as test_client:
        yield test_client


def ui_chunks(text: str) -> list[dict[str, Any]]:
    """The UI message stream's chunks; asserts the stream ends with ``[DONE]``."""
    data = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", text
    return [json.loads(d) for d in data[:-1]]


def user_message(text: str, id: str | None = None) -> dict[str, Any]:
    return {"id": id or uuid.uuid4().hex[:16], "role": "user", "parts": [{"type": "text", "text": text}]}


def chat(client: TestClient, agent: str, chat_id: str, messages: list[dict[str, Any]], headers: Any = AUTH) -> Any:
    body = {"id": chat_id, "messages": messages, "trigger": "submit-message"}
    return client.post(f"/v1/chat/vercel-ai/{agent}", json=body, headers=headers)


def assert_error(response: Any, status: int, kind: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == kind, response.text
    assert response.json()["error"]["message"]


# -- the AI SDK's UI message stream -------------------------------------------------------------


def test_a_chat_request_starts_a_run_and_streams_its_reply(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    message = user_message("weather in Paris?")
    response = chat(client, "chat_weather", chat_id, [message])
    assert response.status_code == 200, response.text
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    chunks = ui_chunks(response.text)
    types = [c["type"] for c in chunks]
    assert chunks[0] == {
        "type": "start",
        "messageId": f"reply-{message['id']}",
        "messageMetadata": {"threadId": chat_id, "runId": message["id"]},
    }
    assert types[-1] == "finish" and chunks[-1]["finishReason"] == "stop"
    started = types.index("tool-input-start")
    available = next(c for c in chunks if c["type"] == "tool-input-available")
    assert available["toolName"] == "weather" and available["input"] == {"city": "Paris"}
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["output"] == "21 degrees in Paris" and output["toolCallId"] == available["toolCallId"]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == "It is 21 degrees in Paris."
    assert started < types.index("tool-output-available") < types.index("text-start")
    assert types.count("start-step") == types.count("finish-step") == 2
    # The thread is the chat id and the run is the message id, as /v1 shows them.
    assert threads.get_run(message["id"]).thread_id == chat_id


def test_the_same_request_sent_again_attaches_to_its_run(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    message = user_message("hi")
    first = ui_chunks(chat(client, "chat_greeter", chat_id, [message]).text)
    again = ui_chunks(chat(client, "chat_greeter", chat_id, [message]).text)
    # The same reply (the first as it was written, in deltas; the second replayed from the ledger).
    assert again[0] == first[0] and again[-1] == first[-1] == {"type": "finish", "finishReason": "stop"}
    text = lambda chunks: "".join(c["delta"] for c in chunks if c["type"] == "text-delta")  # noqa: E731
    assert text(first) == text(again) == "Hello from the chat."
    assert len(threads.runs(thread_id=chat_id)) == 1


def test_an_approval_round_trip_through_the_chat_endpoint(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    message = user_message("mail ann")
    chunks = ui_chunks(chat(client, "chat_mailer", chat_id, [message]).text)
    [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
    assert chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    assert threads.get_run(message["id"]).status == "awaiting_approval"
    # useChat sends the assistant message back with the tool part answered (addToolApprovalResponse).
    tool_part = {
        "type": "tool-send_email",
        "toolCallId": request["toolCallId"],
        "state": "approval-responded",
        "input": {"to": "ann@example.com"},
        "approval": {"id": request["approvalId"], "approved": True},
    }
    assistant = {"id": f"reply-{message['id']}", "role": "assistant", "parts": [{"type": "step-start"}, tool_part]}
    resumed = ui_chunks(chat(client, "chat_mailer", chat_id, [message, assistant]).text)
    types = [c["type"] for c in resumed]
    assert resumed[0]["messageId"] == f"reply-{message['id']}"
    output = next(c for c in resumed if c["type"] == "tool-output-available")
    assert output == {
        "type": "tool-output-available",
        "toolCallId": request["toolCallId"],
        "output": "sent to ann@example.com",
    }
    assert "tool-approval-request" not in types and "tool-input-start" not in types  # only what came after
    assert "".join(c["delta"] for c in resumed if c["type"] == "text-delta") == "Done."
    assert threads.get_run(message["id"]).status == "completed"


def test_the_chat_history_is_ui_messages_of_each_run(client: TestClient) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    first, second = user_message("weather in Paris?"), user_message("mail ann")
    ui_chunks(chat(client, "chat_weather", chat_id, [first]).text)
    history = client.get(f"/v1/chat/vercel-ai/chat_weather/{chat_id}/messages", headers=AUTH)
    assert history.status_code == 200
    [user, reply] = history.json()
    assert user == {"id": first["id"], "role": "user", "parts": [{"type": "text", "text": "weather in Paris?"}]}
    assert reply["id"] == f"reply-{first['id']}" and reply["role"] == "assistant"
    assert reply["metadata"] == {"threadId": chat_id, "runId": first["id"]}
    [tool] = [p for p in reply["parts"] if p["type"] == "tool-weather"]
    assert tool["state"] == "output-available" and tool["input"] == {"city": "Paris"}
    assert tool["output"] == "21 degrees in Paris"
    texts = [p for p in reply["parts"] if p["type"] == "text"]
    assert texts == [{"type": "text", "text": "It is 21 degrees in Paris.", "state": "done"}]
    assert [p["type"] for p in reply["parts"]].count("step-start") == 2
    # Another chat's history is its own; another tenant's is empty.
    other = f"chat-{uuid.uuid4().hex[:8]}"
    ui_chunks(chat(client, "chat_mailer", other, [second]).text)
    [_, waiting] = client.get(f"/v1/chat/vercel-ai/chat_mailer/{other}/messages", headers=AUTH).json()
    [asking] = [p for p in waiting["parts"] if p["type"] == "tool-send_email"]
    assert asking["state"] == "approval-requested" and asking["approval"]["id"].endswith(":0:0")
    assert client.get(f"/v1/chat/vercel-ai/chat_weather/{chat_id}/messages", headers=OTHER_AUTH).json() == []
    assert_error(client.get(f"/v1/chat/vercel-ai/chat_mailer/{chat_id}/messages", headers=AUTH), 409, "conflict")


def test_a_denial_through_the_chat_endpoint_is_a_denied_tool_part(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    message = user_message("mail ann")
    chunks = ui_chunks(chat(client, "chat_mailer", chat_id, [message]).text)
    [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
    tool_part = {
        "type": "tool-send_email",
        "toolCallId": request["toolCallId"],
        "state": "approval-responded",
        "input": {"to": "ann@example.com"},
        "approval": {"id": request["approvalId"], "approved": False, "reason": "not today"},
    }
    assistant = {"id": f"reply-{message['id']}", "role": "assistant", "parts": [tool_part]}
    resumed = ui_chunks(chat(client, "chat_mailer", chat_id, [message, assistant]).text)
    assert {"type": "tool-output-denied", "toolCallId": request["toolCallId"]} in resumed
    assert threads.messages(chat_id)[-2].text == "denied: not today"


def test_resume_replays_the_run_in_progress_and_is_204_when_there_is_none(client: TestClient) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    message = user_message("mail ann")
    chunks = ui_chunks(chat(client, "chat_mailer", chat_id, [message]).text)
    resumed = client.get(f"/v1/chat/vercel-ai/chat_mailer/{chat_id}/stream", headers=AUTH)
    assert resumed.status_code == 200
    # Waiting for approval: the whole reply again, as committed (the live argument deltas are over).
    replayed = ui_chunks(resumed.text)
    committed = [c for c in chunks if not c["type"].endswith("-delta")]
    assert [c for c in replayed if not c["type"].endswith("-delta")] == committed
    assert client.get(f"/v1/chat/vercel-ai/chat_mailer/never-{chat_id}/stream", headers=AUTH).status_code == 204
    done = f"chat-{uuid.uuid4().hex[:8]}"
    ui_chunks(chat(client, "chat_greeter", done, [user_message("hi")]).text)
    assert client.get(f"/v1/chat/vercel-ai/chat_greeter/{done}/stream", headers=AUTH).status_code == 204


def test_bad_chat_requests_get_the_usual_error_body(client: TestClient) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    assert_error(chat(client, "no_such_agent", chat_id, [user_message("hi")]), 404, "unknown_agent")
    assert_error(chat(client, "chat_greeter", chat_id, []), 422, "validation_error")
    assert_error(chat(client, "chat_greeter", "bad id!", [user_message("hi")]), 422, "validation_error")
    body = {"id": chat_id, "messages": [user_message("hi")], "trigger": "regenerate-message"}
    assert_error(client.post("/v1/chat/vercel-ai/chat_greeter", json=body, headers=AUTH), 404, "message_not_found")
    body = {"id": chat_id, "messages": [user_message("hi")], "trigger": "rewrite-everything"}
    assert_error(client.post("/v1/chat/vercel-ai/chat_greeter", json=body, headers=AUTH), 422, "validation_error")
    assert_error(client.post("/v1/chat/vercel-ai/chat_greeter", content=b"{", headers=AUTH), 422, "validation_error")
    huge = chat(client, "chat_greeter", chat_id, [user_message("x" * (2 * 1024 * 1024))])
    assert_error(huge, 413, "payload_too_large")
    assert_error(client.post("/v1/chat/vercel-ai/chat_greeter", json={}), 401, "unauthorized")
    ui_chunks(chat(client, "chat_greeter", chat_id, [user_message("hi")]).text)
    assert_error(chat(client, "chat_weather", chat_id, [user_message("hi")]), 409, "conflict")


def test_another_tenants_chat_is_not_theirs(client: TestClient, threads: Threads) -> None:
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    message = user_message("mail ann")
    chunks = ui_chunks(chat(client, "chat_mailer", chat_id, [message]).text)
    [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
    # The other tenant's resume sees nothing of it; its approval of the call is refused and changes nothing.
    assert client.get(f"/v1/chat/vercel-ai/chat_mailer/{chat_id}/stream", headers=OTHER_AUTH).status_code == 204
    tool_part = {
        "type": "tool-send_email",
        "toolCallId": request["toolCallId"],
        "state": "approval-responded",
        "input": {"to": "ann@example.com"},
        "approval": {"id": request["approvalId"], "approved": True},
    }
    assistant = {"id": f"reply-{message['id']}", "role": "assistant", "parts": [tool_part]}
    answered = chat(client, "chat_mailer", chat_id, [message, assistant], headers=OTHER_AUTH)
    assert_error(answered, 404, "call_not_found")
    assert threads.get_run(message["id"]).status == "awaiting_approval"
    # With an approval of its own beside it, nothing is recorded either: every answer is checked first.
    theirs_id = f"chat-{uuid.uuid4().hex[:8]}"
    their_message = user_message("mail ann")
    their_chunks = ui_chunks(chat(client, "chat_mailer", theirs_id, [their_message], headers=OTHER_AUTH).text)
    [their_request] = [c for c in their_chunks if c["type"] == "tool-approval-request"]
    own_part = {
        **tool_part,
        "toolCallId": their_request["toolCallId"],
        "approval": {"id": their_request["approvalId"], "approved": True},
    }
    both = {"id": "reply-x", "role": "assistant", "parts": [own_part, tool_part]}
    assert_error(
        chat(client, "chat_mailer", theirs_id, [their_message, both], headers=OTHER_AUTH), 404, "call_not_found"
    )
    assert threads.pending(f"globex~{their_message['id']}")[0].status == "awaiting_approval"
    # The same chat id is, for the other tenant, a thread of its own.
    theirs = ui_chunks(chat(client, "chat_greeter", chat_id, [user_message("hi")], headers=OTHER_AUTH).text)
    assert theirs[0]["messageMetadata"]["threadId"] == chat_id
    assert len(threads.runs(thread_id=chat_id)) == 1


# -- AG-UI ---------------------------------------------------------------------------------------


def agui_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def run_input(thread_id: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {
        "threadId": thread_id,
        "runId": str(uuid.uuid4()),
        "protocolVersion": "1.0.0",
        "state": {},
        "messages": messages,
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    return {**body, **extra}


def test_an_ag_ui_run_streams_text_and_tool_calls(client: TestClient) -> None:
    thread_id = str(uuid.uuid4())
    body = run_input(thread_id, [{"id": str(uuid.uuid4()), "role": "user", "content": "weather in Paris?"}])
    response = client.post("/v1/chat/ag-ui/chat_weather", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    events = agui_events(response.text)
    types = [e["type"] for e in events]
    assert events[0] == {"type": "RUN_STARTED", "threadId": thread_id, "runId": body["runId"]}
    assert types[-1] == "RUN_FINISHED" and events[-1]["runId"] == body["runId"]
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    assert start["toolCallName"] == "weather"
    # Every parent message id is announced before a tool call names it.
    assert any(e["type"] == "TEXT_MESSAGE_START" and e["messageId"] == start["parentMessageId"] for e in events)
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(args) == {"city": "Paris"}
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert result["content"] == "21 degrees in Paris"
    assert types.index("TOOL_CALL_START") < types.index("TOOL_CALL_END") < types.index("TOOL_CALL_RESULT")
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "It is 21 degrees in Paris."


def test_an_ag_ui_approval_is_an_interrupt_answered_by_resume(client: TestClient, threads: Threads) -> None:
    thread_id = str(uuid.uuid4())
    user = {"id": str(uuid.uuid4()), "role": "user", "content": "mail ann"}
    events = agui_events(
        client.post("/v1/chat/ag-ui/chat_mailer", json=run_input(thread_id, [user]), headers=AUTH).text
    )
    finished = events[-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "interrupt"
    [interrupt] = finished["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_call" and interrupt["responseSchema"]["required"] == ["approved"]
    bad = run_input(
        thread_id,
        [user],
        resume=[{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": "yes"}}],
    )
    assert_error(client.post("/v1/chat/ag-ui/chat_mailer", json=bad, headers=AUTH), 422, "validation_error")
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    answered = client.post("/v1/chat/ag-ui/chat_mailer", json=run_input(thread_id, [user], resume=resume), headers=AUTH)
    after = agui_events(answered.text)
    result = next(e for e in after if e["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == interrupt["toolCallId"] and result["content"] == "sent to ann@example.com"
    assert after[-1]["type"] == "RUN_FINISHED" and "outcome" not in after[-1]
    assert threads.get_run(user["id"]).status == "completed"


def test_an_older_ag_ui_client_gets_approvals_as_custom_events(client: TestClient) -> None:
    thread_id = str(uuid.uuid4())
    user = {"id": str(uuid.uuid4()), "role": "user", "content": "mail ann"}
    body = run_input(thread_id, [user])
    del body["protocolVersion"]
    events = agui_events(client.post("/v1/chat/ag-ui/chat_mailer", json=body, headers=AUTH).text)
    [custom] = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "threads.approval"]
    assert custom["value"]["reason"] == "tool_call"
    assert events[-1]["type"] == "RUN_FINISHED" and "outcome" not in events[-1]


def test_bad_ag_ui_requests_get_the_usual_error_body(client: TestClient) -> None:
    thread_id = str(uuid.uuid4())
    user = {"id": str(uuid.uuid4()), "role": "user", "content": "hi"}
    post = lambda agent, body, headers=AUTH: client.post(f"/v1/chat/ag-ui/{agent}", json=body, headers=headers)  # noqa: E731
    assert_error(post("no_such_agent", run_input(thread_id, [user])), 404, "unknown_agent")
    assert_error(post("chat_greeter", {"threadId": thread_id}), 422, "validation_error")
    assert_error(post("chat_greeter", run_input("bad id!", [user])), 422, "validation_error")
    big = {"id": str(uuid.uuid4()), "role": "user", "content": "x" * (2 * 1024 * 1024)}
    assert_error(post("chat_greeter", run_input(thread_id, [big])), 413, "payload_too_large")
    agui_events(post("chat_greeter", run_input(thread_id, [user])).text)
    # Another tenant's interrupt id is one it does not have.
    resume = [{"interruptId": "run_x:0:0", "status": "resolved", "payload": {"approved": True}}]
    assert_error(post("chat_greeter", run_input(thread_id, [user], resume=resume), OTHER_AUTH), 404, "call_not_found")
