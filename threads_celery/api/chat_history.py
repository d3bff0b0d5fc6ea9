"""A chat's history as the AI SDK's ``UIMessage`` list, for ``useChat``'s initial ``messages``.

``GET /v1/chat/vercel-ai/{agent}/{chat id}/messages`` answers, for each run of the thread, the
user's message (id: the run id) and the run's reply (id: ``reply-<run id>``), the reply built from
the same parts as its stream (:class:`~threads_celery.api.chat_parts.ReplyParts`) over the
committed events only, of the thread's current branch (a regenerate or an edit leaves the runs
after it behind: see :mod:`~threads_celery.api.chat_branches`); a user message keeps the id the
client gave it. A run in progress shows what it committed so far; ``useChat``'s resume
then replays its reply, which replaces that message by its id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic_ai.ui.vercel_ai.request_types import (
    DataUIPart,
    ReasoningUIPart,
    StepStartUIPart,
    TextUIPart,
    ToolApprovalRequested,
    ToolApprovalRequestedPart,
    ToolApprovalResponded,
    ToolInputAvailablePart,
    ToolInputStreamingPart,
    ToolOutputAvailablePart,
    ToolOutputDeniedPart,
    ToolOutputErrorPart,
    UIMessage,
    UIMessagePart,
)

from threads_celery.api import chat_parts as reply
from threads_celery.api.bodies import Shown
from threads_celery.api.chat_branches import message_id_of

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.records import Event


class _Reply:
    """The parts of one run's reply folded into ``UIMessage`` parts."""

    def __init__(self) -> None:
        self.parts: list[UIMessagePart] = []
        self._texts: dict[str, int] = {}  # text or reasoning id -> index in parts
        self._tools: dict[str, int] = {}  # call id -> index in parts
        self._names: dict[str, str] = {}
        self._inputs: dict[str, Any] = {}

    def _tool(self, call_id: str, part: UIMessagePart) -> None:
        if call_id in self._tools:
            self.parts[self._tools[call_id]] = part
        else:
            self._tools[call_id] = len(self.parts)
            self.parts.append(part)

    def add(self, part: reply.Part) -> None:
        match part:
            case reply.StepStart():
                self.parts.append(StepStartUIPart())
            case reply.TextStart(id=id):
                self._texts[id] = len(self.parts)
                self.parts.append(TextUIPart(text="", state="done"))
            case reply.ReasoningStart(id=id):
                self._texts[id] = len(self.parts)
                self.parts.append(ReasoningUIPart(text="", state="done"))
            case reply.TextDelta(id=id, delta=delta) | reply.ReasoningDelta(id=id, delta=delta):
                found = self.parts[self._texts[id]]
                if isinstance(found, TextUIPart | ReasoningUIPart):
                    found.text += delta
            case reply.ToolStart(call_id=call_id, name=name):
                self._names[call_id] = name
                self._tool(call_id, ToolInputStreamingPart(type=f"tool-{name}", tool_call_id=call_id))
            case reply.ToolInput(call_id=call_id, name=name, input=input):
                self._names[call_id], self._inputs[call_id] = name, input
                self._tool(call_id, ToolInputAvailablePart(type=f"tool-{name}", tool_call_id=call_id, input=input))
            case reply.ApprovalRequest(approval_id=approval_id, call_id=call_id):
                kind, input = f"tool-{self._names.get(call_id, part.name)}", self._inputs.get(call_id)
                approval = ToolApprovalRequested(id=approval_id)
                self._tool(
                    call_id, ToolApprovalRequestedPart(type=kind, tool_call_id=call_id, input=input, approval=approval)
                )
            case reply.ToolOutput(call_id=call_id, name=name, content=content, is_error=is_error):
                kind, input = f"tool-{self._names.get(call_id, name)}", self._inputs.get(call_id)
                done: UIMessagePart = (
                    ToolOutputErrorPart(type=kind, tool_call_id=call_id, input=input, error_text=content)
                    if is_error
                    else ToolOutputAvailablePart(type=kind, tool_call_id=call_id, input=input, output=content)
                )
                self._tool(call_id, done)
            case reply.ToolDenied(call_id=call_id, name=name, content=content):
                kind, input = f"tool-{self._names.get(call_id, name)}", self._inputs.get(call_id)
                denied = ToolApprovalResponded(id=call_id, approved=False, reason=content)
                self._tool(call_id, ToolOutputDeniedPart(type=kind, tool_call_id=call_id, input=input, approval=denied))
            case reply.Waiting():
                data = {"effectKey": part.effect_key, "status": part.status, "tool": part.tool, "reason": part.reason}
                self.parts.append(DataUIPart(type="data-threads-waiting", id=part.effect_key, data=data))
            case reply.StepVoided(step=step, attempt=attempt):
                void = {"step": step, "attempt": attempt}
                self.parts.append(DataUIPart(type="data-threads-step-void", data=void))


def ui_messages(threads: Threads, thread_id: str, shown: Shown, parts_of: Any) -> list[dict[str, Any]]:
    """The thread's runs as ``UIMessage`` dicts, user message then reply, oldest run first.

    ``parts_of(run_id)`` gives the run's :class:`~threads_celery.api.chat_parts.ReplyParts`.
    """
    order: list[str] = []
    users: dict[str, str] = {}
    replies: dict[str, tuple[reply.ReplyParts, _Reply]] = {}
    # The current branch only: a run whose user message a branch left behind is not shown, nor
    # a message superseded by a rewind.
    with threads.store.read() as tx:
        left_runs = tx.superseded_run_ids(thread_id)
        left_seqs = {m.seq for m in tx.list_messages(thread_id, include_superseded=True) if m.superseded_by is not None}
    message_ids = {r.id: message_id_of(r, shown) for r in threads.runs(thread_id=thread_id, limit=10_000)}

    def feed(event: Event) -> None:
        run_id = event.run_id
        if run_id is None or run_id in left_runs:
            return
        if event.type == "message" and event.payload.get("seq") in left_seqs:
            return
        if run_id not in replies:
            order.append(run_id)
            replies[run_id] = (parts_of(run_id), _Reply())
        parts, folded = replies[run_id]
        if event.type == "message" and event.payload.get("role") == "user":
            users.setdefault(run_id, str(event.payload.get("text") or ""))
            return
        if parts.done and event.type == "run" and event.payload.get("status") == "running":
            parts.done = False  # the run went on after it waited for a person
        for part in parts.committed(event):
            folded.add(part)

    for event in threads.events(thread_id):
        feed(event)
    messages: list[dict[str, Any]] = []
    for run_id in order:
        shown_run = shown(run_id)
        if run_id in users:
            user_id = message_ids.get(run_id, shown_run)
            user = UIMessage(id=user_id, role="user", parts=[TextUIPart(text=users[run_id])])
            messages.append(user.model_dump(mode="json", by_alias=True))
        parts = replies[run_id][1].parts
        if parts:
            metadata = {"threadId": shown(thread_id), "runId": shown_run}
            answer = UIMessage(id=f"reply-{shown_run}", role="assistant", metadata=metadata, parts=parts)
            messages.append(answer.model_dump(mode="json", by_alias=True))
    return messages


__all__ = ["ui_messages"]
