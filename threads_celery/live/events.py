"""The events a live subscriber receives: a thread's committed events and the deltas of the
model step in progress, as typed values.

Committed events come from the ledger (:class:`Committed`, with the ``seq`` a client resumes
from). Deltas (:class:`TextDelta`, :class:`ThinkingDelta`, :class:`ToolCallDelta`) travel outside
the ledger, over the broker, while a model step streams; they are never stored row by row and the
committed message stays the truth. Every delta names its run, step and ``attempt`` (the fence of
the claim that streamed it: a retried step streams under a higher one), the model part it belongs
to and its ``seq``, which counts the step attempt's deltas from 1 with no gap: a client rebuilds a
part's text by appending deltas in ``seq`` order, and sees a gap as a ``seq`` skipped.

:class:`StepEnd` says that a step's attempt streamed its last delta, and which ``seq`` that was:
a client that has every ``seq`` from 1 to it has the attempt's whole text.
:class:`StepVoid` says that what a step's attempt (and every earlier attempt of that step)
streamed is void: its worker died or its model call failed, and the step runs again from its
start. :class:`Resync` says that this subscriber fell behind and some deltas were dropped: the
stream goes on with the committed events after ``after`` and the step in progress from its start.

A step's partial text is superseded by its committed assistant ``message`` event (and by the
run's end): a client drops what it built from the run's deltas when that arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from threads_celery.records import Event

#: The SSE event types of the deltas and stream controls (committed events keep their own type).
DELTA_TYPES = ("text_delta", "thinking_delta", "tool_call_delta")
CONTROL_TYPES = ("step_end", "step_void", "resync")


@dataclass(frozen=True, slots=True)
class _OfStepAttempt:
    """What names a model step's attempt; its JSON is its ``type`` and every field, in order."""

    type: ClassVar[str]
    run_id: str
    step: int
    attempt: int

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True, slots=True)
class _StreamedPiece(_OfStepAttempt):
    #: The model part (text, thinking and tool-call parts of one reply share one numbering).
    part: int
    #: This delta's place among the step attempt's deltas, from 1, without gaps.
    seq: int


@dataclass(frozen=True, slots=True)
class TextDelta(_StreamedPiece):
    """A piece of the reply's text as the model writes it."""

    type: ClassVar[Literal["text_delta"]] = "text_delta"
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta(_StreamedPiece):
    """A piece of the model's thinking, where the model sends it."""

    type: ClassVar[Literal["thinking_delta"]] = "thinking_delta"
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta(_StreamedPiece):
    """A fragment of a tool call's arguments (JSON text) as the model writes them. The first
    delta of a part may have empty ``args``: the call's name and id are known before them."""

    type: ClassVar[Literal["tool_call_delta"]] = "tool_call_delta"
    call_id: str
    name: str
    args: str


@dataclass(frozen=True, slots=True)
class StepEnd(_OfStepAttempt):
    """``attempt`` of the run's ``step`` streamed its last delta: ``last_seq`` (0 when it streamed
    none). It comes before the step's committed message; with every seq from 1 to ``last_seq``,
    the deltas are the whole text."""

    type: ClassVar[Literal["step_end"]] = "step_end"
    last_seq: int


@dataclass(frozen=True, slots=True)
class StepVoid(_OfStepAttempt):
    """Everything streamed by ``attempt`` of the run's ``step`` (and by its earlier attempts) is void."""

    type: ClassVar[Literal["step_void"]] = "step_void"


@dataclass(frozen=True, slots=True)
class Resync:
    """Deltas were lost for this subscriber: it fell behind (``reason`` ``overflow``), the
    process's broker subscription was cut (``lost``), or a step's message was committed and its
    stream's end never came (``incomplete``). What follows: the committed events after ``after``
    (the last committed seq it was sent), then the step in progress from its start; drop every
    partial text built so far."""

    type: ClassVar[Literal["resync"]] = "resync"
    after: int
    reason: str = "overflow"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "after": self.after, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Committed:
    """An event of the thread's log, committed to the ledger (``seq`` is its ``id:`` on SSE)."""

    event: Event

    @property
    def type(self) -> str:
        return self.event.type

    @property
    def seq(self) -> int:
        return self.event.seq

    @property
    def run_id(self) -> str | None:
        return self.event.run_id

    @property
    def payload(self) -> dict[str, Any]:
        return self.event.payload


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing happened for a while (only when a heartbeat was asked for): SSE sends a comment."""

    type: ClassVar[Literal["heartbeat"]] = "heartbeat"


Delta = TextDelta | ThinkingDelta | ToolCallDelta
LiveEvent = TextDelta | ThinkingDelta | ToolCallDelta | StepEnd | StepVoid | Resync | Committed

__all__ = [
    "CONTROL_TYPES",
    "DELTA_TYPES",
    "Committed",
    "Delta",
    "Heartbeat",
    "LiveEvent",
    "Resync",
    "StepEnd",
    "StepVoid",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallDelta",
]
