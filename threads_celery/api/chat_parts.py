"""The parts of a chat reply: a run's events, committed and live, as protocol-neutral items.

:class:`ReplyParts` turns one run's events, in thread order, into :data:`Part` items (text,
reasoning, tool calls and results, approvals, the run's end) that each chat protocol encodes with
its own event models (:mod:`~threads_celery.api.chat_vercel`, :mod:`~threads_celery.api.chat_agui`).
Every part it opens it closes before :class:`RunEnd`; streamed text is completed, never repeated,
by the committed message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from threads_celery.api.bodies import Shown
from threads_celery.records import Event

#: A run in one of these has ended; its reply is whole.
ENDED = frozenset({"completed", "error", "aborted", "interrupted"})
#: A run in one of these waits for a person: the reply ends here and a later request goes on.
WAITS_FOR_A_PERSON = frozenset({"awaiting_approval", "awaiting_variable", "parked"})


# -- the parts of a reply ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepStart:
    """A model step begins (the previous one, if any, is over)."""


@dataclass(frozen=True, slots=True)
class TextStart:
    id: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    id: str
    delta: str


@dataclass(frozen=True, slots=True)
class TextEnd:
    id: str


@dataclass(frozen=True, slots=True)
class ReasoningStart:
    id: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    id: str
    delta: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    id: str


@dataclass(frozen=True, slots=True)
class ToolStart:
    """The model began a tool call: its name is known, its arguments may follow in pieces."""

    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArgsDelta:
    call_id: str
    delta: str


@dataclass(frozen=True, slots=True)
class ToolInput:
    """A tool call's arguments are whole (``args`` is their JSON text, ``input`` parsed)."""

    call_id: str
    name: str
    args: str
    input: Any
    streamed_args: str = ""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    call_id: str
    name: str
    content: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class ToolDenied:
    """A person denied the call; the model was shown ``content`` (``denied: <reason>``)."""

    call_id: str
    name: str
    content: str


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A call waits for a person's approval. ``approval_id`` is its effect key as the caller sees it."""

    approval_id: str
    call_id: str
    name: str
    args: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """Something other than an approval waits for a person (a parked call, a variable, a child's call).

    It is answered through ``/v1`` (``/v1/calls/{effect_key}/resolve``, ``/approve``...).
    """

    effect_key: str
    status: str
    tool: str
    reason: str
    kind: str


@dataclass(frozen=True, slots=True)
class StepVoided:
    """What the model step streamed so far is void (its worker died or its model call failed).

    The committed message, or the step's next attempt, follows; text already shown stays shown
    in protocols that cannot take it back, so a page may drop the parts before this one.
    """

    step: int
    attempt: int


@dataclass(frozen=True, slots=True)
class RunEnd:
    """The reply is over: the run ended (``completed``, ``error``...) or waits for a person (``waiting``)."""

    status: str
    output: str | None = None
    error: str | None = None


Part = (
    StepStart
    | TextStart
    | TextDelta
    | TextEnd
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | ToolStart
    | ToolArgsDelta
    | ToolInput
    | ToolOutput
    | ToolDenied
    | ApprovalRequest
    | Waiting
    | StepVoided
    | RunEnd
)


def parsed_args(args: str) -> Any:
    """A call's arguments as JSON, or the raw text when the model sent something that is not JSON."""
    try:
        return json.loads(args) if args else {}
    except ValueError:
        return args


@dataclass
class ReplyParts:
    """One run's events in, the parts of its chat reply out.

    Feed it the thread's events in order (:meth:`committed`); events of other runs are skipped.
    Every part it opens it closes before :class:`RunEnd`, so a client never sees a dangling part.
    ``lookup`` reads what waits for a person when the run stops for one (``threads.pending``),
    and whether an erroring call was denied.
    """

    run_id: str
    shown: Shown
    pending: Callable[[str], list[Any]]
    resolution_of: Callable[[str], str | None]
    done: bool = False
    _step_open: bool = False
    _text: str | None = None  # id of the open text part
    _reasoning: str | None = None
    _tools_started: set[str] = field(default_factory=set)
    _tools_args: dict[str, str] = field(default_factory=dict)  # call id -> args streamed so far
    _effect_keys: dict[str, str] = field(default_factory=dict)  # call id -> effect key
    _counter: int = 0
    _streamed_text: str = ""  # the open text part's text so far
    _delivered: dict[tuple[int, int], int] = field(default_factory=dict)  # (step, attempt) -> last seq shown
    _gapped: set[tuple[int, int]] = field(default_factory=set)

    def fresh(self, step: int, attempt: int, seq: int) -> bool:
        """Whether a delta is the next one of its step's attempt, to be shown.

        Deltas are numbered per step attempt from 1, and replayed from 1 (a reconnect, a resync):
        one shown already is not fresh. After a gap (deltas lost before this client got them) the
        attempt's later deltas are not shown either, so the partial text stays a true start of the
        message, which completes it when it commits.
        """
        key = (step, attempt)
        last = self._delivered.get(key, 0)
        if key in self._gapped or seq <= last:
            return False
        if seq != last + 1:
            self._gapped.add(key)
            return False
        self._delivered[key] = seq
        return True

    def resynced(self) -> None:
        """The step in progress is replayed from its start after a resync: a gap may be filled now."""
        self._gapped.clear()

    def void(self, step: int, attempt: int) -> list[Part]:
        """A step's attempt (and its earlier ones) streamed in vain: close its parts, say so."""
        out = self.close_text()
        self._streamed_text = ""
        self._tools_args.clear()
        return [*out, StepVoided(step, attempt)]

    def _id(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}_{self.shown(self.run_id)}_{self._counter}"

    def _open_step(self) -> list[Part]:
        if self._step_open:
            return []
        self._step_open = True
        return [StepStart()]

    def close_text(self) -> list[Part]:
        out: list[Part] = []
        if self._reasoning is not None:
            out.append(ReasoningEnd(self._reasoning))
            self._reasoning = None
        if self._text is not None:
            out.append(TextEnd(self._text))
            self._text = None
        return out

    def _step_done(self) -> None:
        """The step's message is committed: what comes next belongs to the next model step."""
        self._step_open = False

    # -- live pieces (the model's deltas, before the step commits) --------------------------------

    def text_delta(self, text: str) -> list[Part]:
        if not text:
            return []
        out = self._open_step()
        if self._reasoning is not None:
            out += [ReasoningEnd(self._reasoning)]
            self._reasoning = None
        if self._text is None:
            self._text = self._id("text")
            out.append(TextStart(self._text))
        self._streamed_text += text
        out.append(TextDelta(self._text, text))
        return out

    def reasoning_delta(self, text: str) -> list[Part]:
        if not text:
            return []
        out = self._open_step()
        if self._text is not None:
            out += [TextEnd(self._text)]
            self._text = None
        if self._reasoning is None:
            self._reasoning = self._id("reasoning")
            out.append(ReasoningStart(self._reasoning))
        out.append(ReasoningDelta(self._reasoning, text))
        return out

    def tool_args_delta(self, call_id: str, name: str, args: str) -> list[Part]:
        out = self._open_step() + self.close_text()
        if call_id not in self._tools_started:
            self._tools_started.add(call_id)
            out.append(ToolStart(call_id, name))
        if args:
            self._tools_args[call_id] = self._tools_args.get(call_id, "") + args
            out.append(ToolArgsDelta(call_id, args))
        return out

    # -- committed events --------------------------------------------------------------------------

    def committed(self, event: Event) -> list[Part]:
        if self.done or event.run_id != self.run_id:
            return []
        payload = event.payload
        if event.type == "tool_call_started":
            return self.tool_args_delta(str(payload.get("call_id")), str(payload.get("name")), "")
        if event.type == "message":
            return self._message(payload)
        if event.type == "run":
            return self._run_status(payload)
        return []

    def _message(self, payload: dict[str, Any]) -> list[Part]:
        role = payload.get("role")
        if role == "assistant":
            return self._assistant(payload)
        if role == "tool" and isinstance(payload.get("tool_result"), dict):
            result = payload["tool_result"]
            call_id, name = str(result.get("call_id")), str(result.get("name"))
            content = str(result.get("content", payload.get("text") or ""))
            key = self._effect_keys.get(call_id)
            if result.get("is_error") and key is not None and self.resolution_of(key) == "denied":
                return [ToolDenied(call_id, name, content)]
            return [ToolOutput(call_id, name, content, bool(result.get("is_error")))]
        return []

    def _assistant(self, payload: dict[str, Any]) -> list[Part]:
        out = self._open_step()
        text = str(payload.get("text") or "")
        # The committed message is the truth. When the step's text was streamed, send only what
        # the stream had not sent yet (in the open text part, or a new one when a tool call closed
        # it); a stream that does not lead to it (voided, or pieces lost) is closed and the
        # committed text is shown whole.
        streamed = self._streamed_text
        if streamed and text.startswith(streamed):
            rest, text = text[len(streamed) :], ""
            if rest and self._text is None:
                out += self.close_text()
                self._text = self._id("text")
                out.append(TextStart(self._text))
            if rest and self._text is not None:
                out.append(TextDelta(self._text, rest))
        out += self.close_text()
        if text:
            text_id = self._id("text")
            out += [TextStart(text_id), TextDelta(text_id, text), TextEnd(text_id)]
        for call in payload.get("tool_calls") or []:
            call_id, name, args = str(call.get("id")), str(call.get("name")), str(call.get("args") or "")
            if isinstance(call.get("effect_key"), str):
                self._effect_keys[call_id] = call["effect_key"]
            if call_id not in self._tools_started:
                self._tools_started.add(call_id)
                out.append(ToolStart(call_id, name))
            out.append(ToolInput(call_id, name, args, parsed_args(args), self._tools_args.pop(call_id, "")))
        self._streamed_text = ""
        self._step_done()
        return out

    def _run_status(self, payload: dict[str, Any]) -> list[Part]:
        status = str(payload.get("status"))
        if status in ENDED:
            self.done = True
            output = payload.get("output")
            error = payload.get("error")
            return [
                *self.close_text(),
                RunEnd(status, output=str(output) if output is not None else None, error=_error_text(error)),
            ]
        if status in WAITS_FOR_A_PERSON:
            self.done = True
            out: list[Part] = self.close_text()
            for call in self.pending(self.run_id):
                if call.kind == "call" and call.status == "awaiting_approval" and call.run_id == self.run_id:
                    call_id = next((c for c, k in self._effect_keys.items() if k == call.effect_key), call.effect_key)
                    out.append(ApprovalRequest(self.shown(call.effect_key), call_id, call.tool, call.args))
                else:
                    out.append(
                        Waiting(self.shown(call.effect_key), call.status, call.tool, self.shown(call.reason), call.kind)
                    )
            out.append(RunEnd("waiting"))
            return out
        return []


def _error_text(error: Any) -> str | None:
    if error is None:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or json.dumps(error))
    return str(error)


__all__ = [
    "ENDED",
    "WAITS_FOR_A_PERSON",
    "ApprovalRequest",
    "Part",
    "ReasoningDelta",
    "ReasoningEnd",
    "ReasoningStart",
    "ReplyParts",
    "RunEnd",
    "StepStart",
    "StepVoided",
    "TextDelta",
    "TextEnd",
    "TextStart",
    "ToolArgsDelta",
    "ToolDenied",
    "ToolInput",
    "ToolOutput",
    "ToolStart",
    "Waiting",
    "parsed_args",
]
