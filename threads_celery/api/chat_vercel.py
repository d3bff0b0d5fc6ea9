"""The Vercel AI SDK's UI message stream protocol, for ``useChat`` as it is.

``POST /v1/chat/vercel-ai/{agent}`` takes the request ``useChat``'s ``DefaultChatTransport``
sends (``{id, messages, trigger}``) and answers the UI message stream of one run:

- the chat ``id`` is the thread (the caller's own id, as on ``/v1``: a new id starts a thread);
- a last message from the user starts a run with its text; the message's id is the run's id, so
  a request sent again attaches to the run it started instead of starting another;
- a last assistant message whose tool parts carry approval answers (``addToolApprovalResponse``)
  records them, under the token's principal, and streams the run on from where it waited;
- the run's reply is one assistant message, ``reply-<run id>``, whose metadata names the thread and run.

``GET /v1/chat/vercel-ai/{agent}/{id}/messages`` is the chat's history as ``UIMessage`` objects
(:mod:`~threads_celery.api.chat_history`), for ``useChat``'s initial ``messages``.

``GET /v1/chat/vercel-ai/{agent}/{id}/stream`` is ``useChat``'s ``resume``: the thread's run in
progress replayed from its start, then live; ``204`` when nothing is in progress.

The chunks are Pydantic AI's models of the protocol (``pydantic_ai.ui.vercel_ai``), encoded by
its ``VercelAIEventStream`` for AI SDK 6. A call that waits for approval is a
``tool-approval-request`` chunk whose ``approvalId`` is the call's effect key; anything else that
waits for a person is a ``data-threads-waiting`` part, answered through ``/v1``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Path
from fastapi.responses import Response, StreamingResponse
from pydantic_ai.ui.vercel_ai import VercelAIEventStream
from pydantic_ai.ui.vercel_ai.request_types import (
    RegenerateMessage,
    RequestData,
    SubmitMessage,
    TextUIPart,
    ToolApprovalResponded,
    UIMessage,
)
from pydantic_ai.ui.vercel_ai.response_types import (
    BaseChunk,
    DataChunk,
    DoneChunk,
    ErrorChunk,
    FinishChunk,
    FinishStepChunk,
    ReasoningDeltaChunk,
    ReasoningEndChunk,
    ReasoningStartChunk,
    StartChunk,
    StartStepChunk,
    TextDeltaChunk,
    TextEndChunk,
    TextStartChunk,
    ToolApprovalRequestChunk,
    ToolInputAvailableChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    ToolOutputAvailableChunk,
    ToolOutputDeniedChunk,
    ToolOutputErrorChunk,
)
from starlette.concurrency import run_in_threadpool

from threads_celery.api import chat_branches as branching
from threads_celery.api import chat_common as chat
from threads_celery.api import chat_parts as reply
from threads_celery.api.bodies import ID_PATTERN
from threads_celery.api.chat_common import AgentName
from threads_celery.api.chat_history import ui_messages
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller, owned_thread, shown_to, thread_to_start
from threads_celery.exceptions import ThreadNotFound

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

#: The AI SDK major version the stream is encoded for (tool approvals need 6).
SDK_VERSION: Final = 6
STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1", **chat.SSE_HEADERS}
ChatId = Annotated[str, Path(pattern=ID_PATTERN, description="The chat id: the thread.")]


def reply_id(run_id: str) -> str:
    """The id of a run's reply message: not the run id, which is the id of the user's message."""
    return f"reply-{run_id}"


def chunks_of(part: reply.Part, step_open: list[bool]) -> list[BaseChunk]:
    """The UI message stream chunks of one reply part (``step_open`` is the reply's step state)."""
    match part:
        case reply.StepStart():
            out: list[BaseChunk] = [FinishStepChunk()] if step_open[0] else []
            step_open[0] = True
            return [*out, StartStepChunk()]
        case reply.TextStart(id=id):
            return [TextStartChunk(id=id)]
        case reply.TextDelta(id=id, delta=delta):
            return [TextDeltaChunk(id=id, delta=delta)]
        case reply.TextEnd(id=id):
            return [TextEndChunk(id=id)]
        case reply.ReasoningStart(id=id):
            return [ReasoningStartChunk(id=id)]
        case reply.ReasoningDelta(id=id, delta=delta):
            return [ReasoningDeltaChunk(id=id, delta=delta)]
        case reply.ReasoningEnd(id=id):
            return [ReasoningEndChunk(id=id)]
        case reply.ToolStart(call_id=call_id, name=name):
            return [ToolInputStartChunk(tool_call_id=call_id, tool_name=name)]
        case reply.ToolArgsDelta(call_id=call_id, delta=delta):
            return [ToolInputDeltaChunk(tool_call_id=call_id, input_text_delta=delta)]
        case reply.ToolInput(call_id=call_id, name=name, input=input):
            return [ToolInputAvailableChunk(tool_call_id=call_id, tool_name=name, input=input)]
        case reply.ToolOutput(call_id=call_id, content=content, is_error=True):
            return [ToolOutputErrorChunk(tool_call_id=call_id, error_text=content)]
        case reply.ToolOutput(call_id=call_id, content=content):
            return [ToolOutputAvailableChunk(tool_call_id=call_id, output=content)]
        case reply.ToolDenied(call_id=call_id):
            return [ToolOutputDeniedChunk(tool_call_id=call_id)]
        case reply.ApprovalRequest(approval_id=approval_id, call_id=call_id):
            return [ToolApprovalRequestChunk(approval_id=approval_id, tool_call_id=call_id)]
        case reply.Waiting():
            data = {"effectKey": part.effect_key, "status": part.status, "tool": part.tool, "reason": part.reason}
            return [DataChunk(type="data-threads-waiting", id=part.effect_key, data={**data, "kind": part.kind})]
        case reply.StepVoided(step=step, attempt=attempt):
            void = {"step": step, "attempt": attempt}
            return [DataChunk(type="data-threads-step-void", id=f"void-{step}-{attempt}", data=void)]
        case reply.RunEnd(status=status):
            out = [FinishStepChunk()] if step_open[0] else []
            step_open[0] = False
            if status in ("completed", "waiting"):
                reason = "stop" if status == "completed" else "tool-calls"
                return [*out, FinishChunk(finish_reason=reason)]
            text = part.error or f"the run ended: {status}"
            return [*out, ErrorChunk(error_text=text)]
    return []


async def ui_message_stream(
    threads: Threads,
    thread_id: str,
    run_id: str,
    cursor: int,
    shown: Callable[[str], str],
    *,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The run's reply as SSE frames of the UI message stream, ``[DONE]`` last."""
    encoder = VercelAIEventStream(sdk_version=SDK_VERSION)
    start = StartChunk(
        message_id=reply_id(shown(run_id)), message_metadata={"threadId": shown(thread_id), "runId": shown(run_id)}
    )
    yield encoder.encode_event(start)
    parts = chat.reply_parts(threads, run_id, shown)
    step_open = [False]

    def frames_of(part: reply.Part) -> str:
        return "".join(encoder.encode_event(chunk) for chunk in chunks_of(part, step_open))

    async for frames in chat.reply_frames(threads, thread_id, parts, cursor, frames_of, keepalive_s=keepalive_s):
        yield frames
    yield encoder.encode_event(DoneChunk())


def _text_of(message: UIMessage) -> str:
    return "\n".join(p.text for p in message.parts if isinstance(p, TextUIPart))


def _answers_of(message: UIMessage) -> list[chat.Answer]:
    answers = []
    for part in message.parts:
        approval = getattr(part, "approval", None)
        if getattr(part, "state", None) == "approval-responded" and isinstance(approval, ToolApprovalResponded):
            answers.append(chat.Answer(approval.id, approval.approved, approval.reason))
    return answers


def add_vercel_ai_routes(
    router: APIRouter,
    threads: Threads,
    *,
    caller_of: Callable[..., Caller],
    keepalive_s: float,
) -> None:
    """``POST /chat/vercel-ai/{agent}`` and its resume ``GET``, on ``router`` (``/v1``)."""
    errors = chat.error_responses("No such agent, or an approval that is not the caller's.")
    stream_doc = chat.event_stream_response("The AI SDK UI message stream (text/event-stream) of the run.")

    def stream(thread_id: str, run_id: str, cursor: int, caller: Caller) -> StreamingResponse:
        body = ui_message_stream(
            threads,
            thread_id,
            run_id,
            cursor,
            shown_to(caller),
            keepalive_s=keepalive_s,
        )
        return StreamingResponse(body, media_type="text/event-stream", headers=STREAM_HEADERS)

    def plan(agent: str, body: SubmitMessage | RegenerateMessage, caller: Caller) -> tuple[str, str | None, int]:
        """The stored thread, the run to stream (None: nothing to stream) and the cursor to stream after."""
        if not body.messages:
            raise ApiError(422, "validation_error", "messages: the request holds no message")
        thread_id = thread_to_start(threads, caller, body.id)
        latest = chat.latest_run(threads, thread_id)
        chat.check_agent(threads, agent, latest)
        shown = shown_to(caller)
        last = body.messages[-1]
        if isinstance(body, RegenerateMessage):
            return _regenerate(thread_id, body, caller)
        if last.role == "user":
            on_branch = branching.current_runs(threads, thread_id)
            known = branching.run_of_message(on_branch, last.id, shown)
            if known is None:
                if branching.superseded(threads, caller, thread_id, last.id):
                    raise branching.stale(last.id)
                return chat.start_run(threads, caller, agent, thread_id, _text_of(last), last.id)
            text = _text_of(last)
            if known.id == on_branch[-1].id and known.input == text:
                # The same message sent again: its run, replayed.
                return thread_id, known.id, chat.first_event_seq(threads, thread_id, known.id)
            if not text.strip():
                raise ApiError(422, "validation_error", "messages: the last user message has no text")
            return branching.branch_and_stream(threads, caller, thread_id, known, text, "edit", shown)
        answers = _answers_of(last) if last.role == "assistant" else []
        if answers:
            # Every answer is checked (another tenant's or thread's approval is 404), even on a new thread.
            answered, cursor = chat.answer_approvals(threads, caller, thread_id, answers)
            return thread_id, answered, cursor
        return chat.run_in_progress(threads, thread_id, latest)

    def _regenerate(thread_id: str, body: RegenerateMessage, caller: Caller) -> tuple[str, str, int]:
        """``regenerate()``: answer again the user message the request ends with (or names)."""
        shown = shown_to(caller)
        on_branch = branching.current_runs(threads, thread_id)
        named = [body.message_id] if body.message_id else []
        if body.messages[-1].role == "user":
            named.append(body.messages[-1].id)
        target = next((r for r in map(lambda m: branching.run_of_message(on_branch, m, shown), named) if r), None)
        if target is None and named:
            if any(branching.superseded(threads, caller, thread_id, m.removeprefix("reply-")) for m in named):
                raise branching.stale(named[0])
            raise ApiError(404, "message_not_found", f"no message {named[0]!r} in chat {body.id!r} to regenerate")
        if target is None:
            if not on_branch:
                raise ApiError(404, "message_not_found", f"chat {body.id!r} has no reply to regenerate")
            target = on_branch[-1]
        return branching.branch_and_stream(threads, caller, thread_id, target, None, "regenerate", shown)

    @router.post(
        "/chat/vercel-ai/{agent}",
        tags=["chat"],
        response_class=StreamingResponse,
        responses={**stream_doc, **errors},
    )
    async def vercel_ai_chat(
        agent: AgentName,
        body: Annotated[RequestData, Body()],
        caller: Caller = Depends(caller_of),
    ) -> Response:
        """A ``useChat`` request: start a run on the chat's thread, or answer its approvals; its reply streams."""
        if not isinstance(body, SubmitMessage | RegenerateMessage):
            raise ApiError(
                400, "unsupported_trigger", "the request's trigger is not submit-message or regenerate-message"
            )
        if not chat.is_id(body.id):
            raise ApiError(422, "validation_error", "id: a chat id is 1-64 letters, digits, '_', '.', ':' or '-'")
        thread_id, run_id, cursor = await run_in_threadpool(plan, agent, body, caller)
        if run_id is None:
            return StreamingResponse(_empty_reply(), media_type="text/event-stream", headers=STREAM_HEADERS)
        return stream(thread_id, run_id, cursor, caller)

    @router.get("/chat/vercel-ai/{agent}/{chat_id}/messages", tags=["chat"], responses=errors)
    def vercel_ai_history(
        agent: AgentName, chat_id: ChatId, caller: Caller = Depends(caller_of)
    ) -> list[dict[str, Any]]:
        """The chat's history as AI SDK ``UIMessage`` objects, for ``useChat``'s initial ``messages``.

        A chat the caller does not have (never started, or another tenant's) has no messages.
        """
        try:
            thread_id = owned_thread(threads, caller, chat_id)
        except ThreadNotFound:
            return []
        chat.check_agent(threads, agent, chat.latest_run(threads, thread_id))
        shown = shown_to(caller)
        return ui_messages(threads, thread_id, shown, lambda r: chat.reply_parts(threads, r, shown, from_start=True))

    @router.get(
        "/chat/vercel-ai/{agent}/{chat_id}/stream",
        tags=["chat"],
        response_class=StreamingResponse,
        responses={**stream_doc, 204: {"description": "Nothing is in progress on the thread."}, **errors},
    )
    async def vercel_ai_resume(agent: AgentName, chat_id: ChatId, caller: Caller = Depends(caller_of)) -> Response:
        """``useChat``'s resume: the run in progress on the chat's thread, replayed from its start, then live."""

        def find() -> tuple[str, str | None, int]:
            thread_id = owned_thread(threads, caller, chat_id)
            latest = chat.latest_run(threads, thread_id)
            chat.check_agent(threads, agent, latest)
            return chat.run_in_progress(threads, thread_id, latest)

        try:
            thread_id, run_id, cursor = await run_in_threadpool(find)
        except ThreadNotFound:
            return Response(status_code=204)  # a chat that never started has nothing to resume
        if run_id is None:
            return Response(status_code=204)
        return stream(thread_id, run_id, cursor, caller)


async def _empty_reply() -> AsyncIterator[str]:
    encoder = VercelAIEventStream(sdk_version=SDK_VERSION)
    for chunk in (StartChunk(), FinishChunk(finish_reason="stop"), DoneChunk()):
        yield encoder.encode_event(chunk)


__all__ = ["SDK_VERSION", "add_vercel_ai_routes", "chunks_of", "ui_message_stream"]
