"""What the console's pages show, built from ledger records: pure functions, no I/O.

A run's timeline is its steps in order. Step ``n`` is a model turn (the model call that
returned, committed with its usage) followed by the tool calls its reply asked for. The ledger
keeps when a turn was committed, not when its model call began: a turn is shown as starting
when the run started (step 0) or when the last call of the step before it finished, which is
when the step was enqueued.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args

from threads_celery.records import AgentToolRun, CallTimelineEntry, Message, ModelTurn, Run, RunStatus

#: Characters of a result or of arguments shown in the timeline before "whole result".
PREVIEW_CHARS = 2000
#: Characters of a whole result per page of the result viewer.
RESULT_PAGE_CHARS = 256 * 1024

#: Every status a run can have, in the order the console lists them.
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)

ChildKind = Literal["agent tool", "subagent", "detached"]


@dataclass(frozen=True, slots=True)
class TurnView:
    """A model turn: when it started and was committed, what it said, what it used."""

    step: int
    started_at: datetime | None
    ended_at: datetime | None
    text: str
    turn: ModelTurn | None


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of a run: its model turn and the tool calls its reply asked for."""

    step: int
    turn: TurnView | None
    calls: tuple[CallTimelineEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class ChildView:
    """A run started under another one, and its own children."""

    row: AgentToolRun
    kind: ChildKind
    children: tuple[ChildView, ...] = field(default=())


def child_kind(row: AgentToolRun) -> ChildKind:
    """What started a child run: a subagent's lifecycle tool, a detached start, or an agent tool."""
    if (row.display_name or "").startswith("subagent:"):
        return "subagent"
    if row.detached:
        return "detached"
    return "agent tool"


def timeline(
    run: Run, turns: Sequence[ModelTurn], calls: Sequence[CallTimelineEntry], messages: Sequence[Message]
) -> list[StepView]:
    """The run's steps in order (see the module's docstring for when a turn starts)."""
    by_step: dict[int, list[CallTimelineEntry]] = {}
    for call in calls:
        by_step.setdefault(call.step, []).append(call)
    turn_of = {t.step: t for t in turns}
    # The run's replies, in order: one assistant message per committed step.
    replies = [m for m in messages if m.role == "assistant" and m.run_id == run.id]
    steps = sorted(set(by_step) | set(turn_of))
    views: list[StepView] = []
    for position, step in enumerate(steps):
        turn = turn_of.get(step)
        previous = by_step.get(step - 1, [])
        finished = [c.finished_at for c in previous if c.finished_at is not None]
        started = run.started_at if step == 0 else (max(finished) if finished else None)
        reply = replies[position] if position < len(replies) else None
        ended = turn.created_at if turn is not None else (reply.created_at if reply is not None else None)
        view = TurnView(step, started, ended, reply.text if reply is not None else "", turn)
        views.append(
            StepView(step, view if turn is not None or reply is not None else None, tuple(by_step.get(step, [])))
        )
    return views


def ended_because(run: Run, waiting_reasons: Sequence[str] = ()) -> str | None:
    """Why a run ended or waits: its error, else the reason of the first call it waits on."""
    if run.status == "completed":
        return None
    if run.error:
        return run.error
    return next((reason for reason in waiting_reasons if reason), None)


def run_tree(rows_of: Callable[[str], Sequence[AgentToolRun]], run: Run, *, depth: int = 4) -> tuple[ChildView, ...]:
    """The run's children (rows of its thread that it started), theirs, and so on, ``depth`` deep.

    ``rows_of(thread_id)`` answers a thread's agent-tool rows; a child's own children are the rows
    of its child thread started by its child run."""

    def under(thread_id: str, run_id: str, left: int) -> tuple[ChildView, ...]:
        found: list[ChildView] = []
        for row in rows_of(thread_id):
            if row.parent_run_id != run_id:
                continue
            deeper: tuple[ChildView, ...] = ()
            if left > 1 and row.child_thread_id is not None and row.child_run_id is not None:
                deeper = under(row.child_thread_id, row.child_run_id, left - 1)
            found.append(ChildView(row, child_kind(row), deeper))
        return tuple(found)

    return under(run.thread_id, run.id, depth)


__all__ = [
    "PREVIEW_CHARS",
    "RESULT_PAGE_CHARS",
    "RUN_STATUSES",
    "ChildView",
    "StepView",
    "TurnView",
    "child_kind",
    "ended_because",
    "run_tree",
    "timeline",
]
