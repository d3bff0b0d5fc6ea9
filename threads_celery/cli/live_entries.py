"""What a run's terminal view holds: its entries (the user's message, each model turn with its
calls, notes) and the child agent-tool runs drawn under the calls that started them, with the
lines that say who answered a call. :class:`~threads_celery.cli.live.RunView` fills and draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import RenderableType
from rich.text import Text

from threads_celery.cli.live_format import CHILD_END
from threads_celery.records import CallTimelineEntry, Message, ToolCall, ToolResult


@dataclass
class ChildRun:
    """What the parent's event log says about one child agent-tool run."""

    run_id: str
    name: str
    label: str = ""
    status: str = "running"
    fraction: float | None = None
    phase: str | None = None
    message: str | None = None
    activity: str | None = None
    outcome: str | None = None
    milestones: list[str] = field(default_factory=list)
    #: The call that started it, while that call waits (the row is drawn under it).
    call: CallEntry | None = None
    #: It ended before its call had a result, so it is drawn under the call for good.
    ended_with_call: bool = False

    @property
    def is_terminal(self) -> bool:
        return self.status in CHILD_END.values()

    @property
    def floating(self) -> bool:
        """Drawn in the live region: it outlived (or never had) the call that started it."""
        return not self.is_terminal and (self.call is None or self.call.result is not None)


@dataclass
class CallEntry:
    call: ToolCall
    result: ToolResult | None = None
    notes: list[Text] = field(default_factory=list)
    children: list[ChildRun] = field(default_factory=list)


@dataclass
class NoteEntry:
    """One line in the log: a narrated milestone, a run that started or ended, a child that ended."""

    line: RenderableType
    settled: bool = True


@dataclass
class UserEntry:
    text: str
    settled: bool = True


@dataclass
class TurnEntry:
    number: int
    text: str
    calls: list[CallEntry] = field(default_factory=list)

    @property
    def is_answer(self) -> bool:
        """A model turn that calls no tool is the run's answer."""
        return not self.calls

    @property
    def settled(self) -> bool:
        return all(c.result is not None for c in self.calls)


Entry = UserEntry | TurnEntry | NoteEntry


def answer_note(call: CallTimelineEntry) -> tuple[str, str] | None:
    """The note (and its style) saying who answered ``call`` and how; None if nobody did."""
    if call.resolution == "denied":
        return (f"✗ denied by {call.resolved_by}" if call.resolved_by else "✗ denied", "red")
    if call.resolution is not None:
        by = f" by {call.resolved_by}" if call.resolved_by else ""
        return (f"✓ resolved {call.resolution}{by}", "green")
    if call.approved_by:
        return (f"✓ approved by {call.approved_by}", "green")
    return None


def is_narration(message: Message) -> bool:
    """A narrated milestone of a background child: an assistant status line, no model turn."""
    return message.role == "assistant" and (message.meta or {}).get("source") == "agent-tool-milestone"


__all__ = ["CallEntry", "ChildRun", "Entry", "NoteEntry", "TurnEntry", "UserEntry", "answer_note", "is_narration"]
