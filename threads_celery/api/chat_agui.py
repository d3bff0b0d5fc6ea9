"""AG-UI over Server-Sent Events, for ``@ag-ui/client``'s ``HttpAgent`` and the kits built on it.

``POST /v1/chat/ag-ui/{agent}`` takes a ``RunAgentInput`` and answers the AG-UI events of one run:

- ``threadId`` is the thread (the caller's own id, as on ``/v1``);
- a last message from the user starts a run with its text; the message's id is the run's id, so
  the same input sent again (a reconnect, a reload) attaches to the run it started and replays it
  from its start, then live;
- ``resume`` entries answer the approvals the previous reply ended with (AG-UI interrupts,
  protocol 1.0): ``{"approved": true|false, "reason": "...", "editedArgs": {...}}`` in their
  ``payload``; ``status: "cancelled"`` denies. They are recorded under the token's principal
  and the run streams on from where it waited;
- anything else attaches to the thread's run in progress, if there is one.

``RUN_STARTED`` and ``RUN_FINISHED`` carry the request's own ``threadId``/``runId``, as the
protocol asks; a ``CUSTOM`` event ``threads.run`` names the run and thread as ``/v1`` knows them.
A call that waits for approval ends the reply with ``RUN_FINISHED`` whose outcome is an interrupt
per call (its ``id`` is the call's effect key) for a client that declares protocol 1.0, and with
a ``CUSTOM`` event ``threads.approval`` per call for an older one. Anything else that waits for a
person is a ``CUSTOM`` event ``threads.waiting``, answered through ``/v1``. The events are the
``ag_ui.core`` models, encoded by ``ag_ui.encoder.EventEncoder``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, Body, Depends
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError
from pydantic.alias_generators import to_camel
from starlette.concurrency import run_in_threadpool

from threads_celery.api import chat_branches as branching
from threads_celery.api import chat_common as chat
from threads_celery.api import chat_parts as reply
from threads_celery.api.chat_branches import CLIENT_RUN_KEY
from threads_celery.api.chat_common import AgentName
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller, shown_to, thread_to_start
from threads_celery.records import BranchKind

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads


class ApprovalAnswer(BaseModel):
    """The ``payload`` of a ``resume`` entry answering an approval interrupt."""

    model_config = ConfigDict(alias_generator=to_camel)

    approved: StrictBool
    reason: str | None = None
    edited_args: dict[str, Any] | None = None


#: What the interrupts advertise as their ``responseSchema``.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string"},
        "editedArgs": {"type": "object"},
    },
    "required": ["approved"],
}


def _declares_1_0(run_input: RunAgentInput) -> bool:
    """Whether the client speaks AG-UI 1.0 (interrupt outcomes); an unreadable version counts as newer."""
    version = run_input.protocol_version
    if not version:
        return False
    try:
        return int(str(version).split(".")[0]) >= 1
    except ValueError:
        return True


@dataclass
class AguiEvents:
    """Reply parts in, AG-UI events out; keeps the protocol's pairs (message, tool call) closed."""

    thread_id: str
    run_id: str
    interrupts_supported: bool
    _parent: str | None = None  # the assistant message the step's tool calls belong to
    _open_calls: set[str] = field(default_factory=set)
    _interrupts: list[Interrupt] = field(default_factory=list)
    _counter: int = 0

    def _announce_parent(self, out: list[BaseEvent]) -> str:
        if self._parent is None:
            self._counter += 1
            self._parent = f"msg_{self.run_id}_{self._counter}"
            # An assistant message with no text still needs its id announced before it is named.
            out += [
                TextMessageStartEvent(message_id=self._parent, role="assistant"),
                TextMessageEndEvent(message_id=self._parent),
            ]
        return self._parent

    def events(self, part: reply.Part) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        match part:
            case reply.StepStart():
                self._parent = None
            case reply.TextStart(id=id):
                self._parent = id
                out.append(TextMessageStartEvent(message_id=id, role="assistant"))
            case reply.TextDelta(id=id, delta=delta) if delta:
                out.append(TextMessageContentEvent(message_id=id, delta=delta))
            case reply.TextEnd(id=id):
                out.append(TextMessageEndEvent(message_id=id))
            case reply.ReasoningStart(id=id):
                out += [ReasoningStartEvent(message_id=id), ReasoningMessageStartEvent(message_id=id, role="reasoning")]
            case reply.ReasoningDelta(id=id, delta=delta) if delta:
                out.append(ReasoningMessageContentEvent(message_id=id, delta=delta))
            case reply.ReasoningEnd(id=id):
                out += [ReasoningMessageEndEvent(message_id=id), ReasoningEndEvent(message_id=id)]
            case reply.ToolStart(call_id=call_id, name=name):
                parent = self._announce_parent(out)
                self._open_calls.add(call_id)
                out.append(ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name, parent_message_id=parent))
            case reply.ToolArgsDelta(call_id=call_id, delta=delta) if delta:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=delta))
            case reply.ToolInput(call_id=call_id, args=args, streamed_args=streamed):
                if args.startswith(streamed) and args[len(streamed) :]:
                    out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=args[len(streamed) :]))
                if call_id in self._open_calls:
                    self._open_calls.discard(call_id)
                    out.append(ToolCallEndEvent(tool_call_id=call_id))
            case (
                reply.ToolOutput(call_id=call_id, content=content) | reply.ToolDenied(call_id=call_id, content=content)
            ):
                out.append(
                    ToolCallResultEvent(
                        message_id=f"result_{self.run_id}_{call_id}", tool_call_id=call_id, content=content, role="tool"
                    )
                )
            case reply.ApprovalRequest():
                interrupt = Interrupt(
                    id=part.approval_id,
                    reason="tool_call",
                    tool_call_id=part.call_id,
                    message=f"Approve {part.name}({part.args})?",
                    response_schema=APPROVAL_SCHEMA,
                )
                self._interrupts.append(interrupt)
                if not self.interrupts_supported:
                    out.append(CustomEvent(name="threads.approval", value=interrupt.model_dump(by_alias=True)))
            case reply.Waiting():
                value = {
                    "effectKey": part.effect_key,
                    "status": part.status,
                    "tool": part.tool,
                    "reason": part.reason,
                    "kind": part.kind,
                }
                out.append(CustomEvent(name="threads.waiting", value=value))
            case reply.StepVoided(step=step, attempt=attempt):
                out.append(CustomEvent(name="threads.step_void", value={"step": step, "attempt": attempt}))
            case reply.RunEnd(status=status):
                out += [ToolCallEndEvent(tool_call_id=c) for c in sorted(self._open_calls)]
                self._open_calls.clear()
                if status == "completed":
                    out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, result=part.output))
                elif status == "waiting":
                    outcome = (
                        RunFinishedInterruptOutcome(interrupts=self._interrupts)
                        if self._interrupts and self.interrupts_supported
                        else None
                    )
                    out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome))
                else:
                    out.append(RunErrorEvent(message=part.error or f"the run ended: {status}", code=status))
        return out


async def agui_stream(
    threads: Threads,
    run_input: RunAgentInput,
    thread_id: str,
    run_id: str | None,
    cursor: int,
    shown: Callable[[str], str],
    *,
    accept: str | None,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The run's reply as AG-UI SSE frames, from ``RUN_STARTED`` to ``RUN_FINISHED`` or ``RUN_ERROR``."""
    encoder = EventEncoder(accept=accept or "text/event-stream")
    mapper = AguiEvents(run_input.thread_id, run_input.run_id, _declares_1_0(run_input))
    started = RunStartedEvent(
        thread_id=run_input.thread_id, run_id=run_input.run_id, parent_run_id=run_input.parent_run_id
    )
    yield encoder.encode(started)
    if run_id is None:
        yield encoder.encode(RunFinishedEvent(thread_id=run_input.thread_id, run_id=run_input.run_id))
        return
    yield encoder.encode(CustomEvent(name="threads.run", value={"runId": shown(run_id), "threadId": shown(thread_id)}))
    parts = chat.reply_parts(threads, run_id, shown)

    def frames_of(part: reply.Part) -> str:
        return "".join(encoder.encode(event) for event in mapper.events(part))

    async for frames in chat.reply_frames(threads, thread_id, parts, cursor, frames_of, keepalive_s=keepalive_s):
        yield frames


def _text_of(message: UserMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(str(getattr(c, "text", "")) for c in message.content if getattr(c, "type", None) == "text")


def answers_of(run_input: RunAgentInput) -> list[chat.Answer]:
    """The approval answers a request's ``resume`` entries carry; 422 for a payload that does not fit."""
    answers = []
    for entry in run_input.resume or []:
        if entry.status == "cancelled":
            answers.append(chat.Answer(entry.interrupt_id, False, "cancelled by the user"))
            continue
        try:
            payload = ApprovalAnswer.model_validate(entry.payload)
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) or "payload" for e in exc.errors(include_input=False))
            raise ApiError(
                422, "validation_error",
                f"resume payload of interrupt {entry.interrupt_id!r} does not fit its responseSchema ({fields})",
            ) from None  # fmt: skip
        answers.append(chat.Answer(entry.interrupt_id, payload.approved, payload.reason, payload.edited_args))
    return answers


def add_ag_ui_routes(
    router: APIRouter,
    threads: Threads,
    *,
    caller_of: Callable[..., Caller],
    keepalive_s: float,
) -> None:
    """``POST /chat/ag-ui/{agent}`` on ``router`` (``/v1``)."""
    errors = chat.error_responses("No such agent, or an interrupt that is not the caller's.")

    def plan(agent: str, run_input: RunAgentInput, caller: Caller) -> tuple[str, str | None, int]:
        if not chat.is_id(run_input.thread_id):
            raise ApiError(422, "validation_error", "threadId: 1-64 letters, digits, '_', '.', ':' or '-'")
        thread_id = thread_to_start(threads, caller, run_input.thread_id)
        latest = chat.latest_run(threads, thread_id)
        chat.check_agent(threads, agent, latest)
        answers = answers_of(run_input)
        if answers:
            # Every answer is checked (another tenant's or thread's approval is 404), even on a new thread.
            answered, cursor = chat.answer_approvals(threads, caller, thread_id, answers)
            return thread_id, answered, cursor
        last = run_input.messages[-1] if run_input.messages else None
        if isinstance(last, UserMessage):
            return _from_user_message(agent, thread_id, last, run_input, caller)
        return chat.run_in_progress(threads, thread_id, latest)

    def _from_user_message(
        agent: str, thread_id: str, last: UserMessage, run_input: RunAgentInput, caller: Caller
    ) -> tuple[str, str | None, int]:
        """A new message starts a run; a message already answered on the thread's current branch
        is a reconnect (the same input again), or a branch from it: ``parentRunId`` given (a
        regenerate), other text (an edit), or an earlier message of the chat."""
        shown, text = shown_to(caller), _text_of(last)
        on_branch = branching.current_runs(threads, thread_id)
        known = branching.run_of_message(on_branch, last.id, shown)
        if known is None:
            if branching.superseded(threads, caller, thread_id, last.id):
                raise branching.stale(last.id)
            return chat.start_run(threads, caller, agent, thread_id, text, last.id)
        asked_before = next(
            (r for r in on_branch if (r.input_meta or {}).get(CLIENT_RUN_KEY) == run_input.run_id), None
        )
        if asked_before is not None:  # this very request was answered already: replay its run
            return thread_id, asked_before.id, chat.first_event_seq(threads, thread_id, asked_before.id)
        regenerate = run_input.parent_run_id is not None
        if known.id == on_branch[-1].id and known.input == text and not regenerate:
            return thread_id, known.id, chat.first_event_seq(threads, thread_id, known.id)
        if not text.strip():
            raise ApiError(422, "validation_error", "messages: the last user message has no text")
        kind: BranchKind = "regenerate" if known.input == text else "edit"
        return branching.branch_and_stream(
            threads, caller, thread_id, known, text, kind, shown, client_run_id=run_input.run_id
        )

    @router.post(
        "/chat/ag-ui/{agent}",
        tags=["chat"],
        response_class=StreamingResponse,
        responses={**chat.event_stream_response("AG-UI events (text/event-stream) of the run."), **errors},
    )
    async def ag_ui_run(
        agent: AgentName,
        run_input: Annotated[RunAgentInput, Body()],
        caller: Caller = Depends(caller_of),
    ) -> StreamingResponse:
        """An AG-UI run request: start a run on the thread, answer its interrupts or attach; its events stream."""
        thread_id, run_id, cursor = await run_in_threadpool(plan, agent, run_input, caller)
        body = agui_stream(
            threads,
            run_input,
            thread_id,
            run_id,
            cursor,
            shown_to(caller),
            accept="text/event-stream",
            keepalive_s=keepalive_s,
        )
        return StreamingResponse(body, media_type="text/event-stream", headers=chat.SSE_HEADERS)


__all__ = ["APPROVAL_SCHEMA", "AguiEvents", "add_ag_ui_routes", "agui_stream", "answers_of"]
