"""What a delivered task should do, and what runs after it, decided from the ledger alone.

``threads.step`` and ``threads.tool`` load a run (and a call), ask :func:`decide_step` or
:func:`decide_call` whether to do the work, and apply the answer. Whoever then commits a model
reply or a call's result asks :func:`after_reply`, :func:`after_call` or :func:`after_results`
which task runs next, and records it in the same commit. No clock reads, no I/O: every branch is
tested without Celery or a database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, overload

from threads_celery.decisions.effects import (
    AlreadySettled,
    CallRecord,
    LookupAnswer,
    LookupFailed,
    NeedsLookup,
    Park,
    RecordFound,
    RunAgain,
    Wait,
    decide_recovery,
)
from threads_celery.records import CallRow, Run

if TYPE_CHECKING:
    # Only read (``tool.reconcile``), never built: definitions sit above the decisions.
    from threads_celery.definitions.tools import Tool


@dataclass(frozen=True, slots=True)
class Skip:
    """Nothing to do: the task is a duplicate, stale, or its run has ended."""

    reason: str


@dataclass(frozen=True, slots=True)
class Busy:
    """Another worker holds the run's lease until ``until``."""

    until: datetime


@dataclass(frozen=True, slots=True)
class Proceed:
    """Claim the run and do the work."""


StepDecision = Skip | Busy | Proceed


def lease_held(run: Run, now: datetime) -> bool:
    return run.lease_owner is not None and run.lease_expires_at is not None and run.lease_expires_at > now


def decide_step(run: Run | None, step: int, now: datetime) -> StepDecision:
    """Whether a delivery of step ``step`` should run."""
    if run is None:
        return Skip("no such run")
    if run.is_terminal:
        return Skip(f"run is {run.status}")
    if run.step != step:
        return Skip(f"step {step} is not due (the run is at step {run.step})")
    if run.status not in ("queued", "running"):
        return Skip(f"run is {run.status}")
    if lease_held(run, now):
        assert run.lease_expires_at is not None
        return Busy(run.lease_expires_at)
    return Proceed()


CallDecision = Skip | Busy | Proceed | RunAgain | RecordFound | Park | NeedsLookup
AnsweredCallDecision = Skip | Busy | Proceed | RunAgain | RecordFound | Park
"""What :func:`decide_call` answers once it has the lookup's answer: it never asks again."""


@overload
def decide_call(call: CallRow, run: Run, now: datetime, tool: Tool | None, lookup: None = None) -> CallDecision: ...


@overload
def decide_call(
    call: CallRow, run: Run, now: datetime, tool: Tool | None, lookup: LookupAnswer | LookupFailed
) -> AnsweredCallDecision: ...


def decide_call(
    call: CallRow, run: Run, now: datetime, tool: Tool | None, lookup: LookupAnswer | LookupFailed | None = None
) -> CallDecision:
    """Whether a delivery of a tool call should run, and how, given the ledger.

    :class:`NeedsLookup` comes back only while ``lookup`` is None (see
    :func:`~threads_celery.decisions.effects.decide_recovery`): the caller runs the tool's lookup once and
    asks again with its answer.
    """
    if run.is_terminal:
        return Skip(f"run is {run.status}")
    # A match (rather than ``in`` tests) narrows the status to "pending" | "started" below.
    match call.status:
        case "completed" | "error" | "skipped" | "finished":
            return Skip("call already settled")
        case "parked":
            return Skip("call is parked")
        case "awaiting_approval" | "awaiting_variable":
            return Skip(f"call is {call.status.replace('_', ' ')}")
    if run.status != "running":
        return Skip(f"run is {run.status}")
    if run.step != call.step + 1:
        return Skip("call belongs to a step that is not current")
    if call.previous_unsettled and (call.batch is None or call.batch == call.index):
        # A call reached in order runs once the one before it settled, whose commit publishes
        # it: this delivery was published by a result that a crash of PostgreSQL took back
        # (a read_only result's commit does not wait for the disk). The call before runs again
        # from its outbox row, and its result publishes this one again.
        return Skip("the call before it in its reply has not settled")
    if lease_held(run, now):
        assert run.lease_expires_at is not None
        return Busy(run.lease_expires_at)
    if call.status == "pending" and (call.attempt == 0 or call.resolution == "assume_not_done"):
        # Never started, or a person accepted the risk of running it again.
        return Proceed()
    if tool is None:
        # The call started, and no tool of that name exists any more to rerun or look up with.
        return Park(f"tool {call.tool!r} was interrupted mid-call and is no longer defined: a person must decide")
    record = CallRecord(
        effect_key=call.effect_key,
        effect=call.effect,
        status=call.status,
        attempt=call.attempt,
        first_started_at=call.first_started_at,
        lease_expires_at=call.lease_expires_at,
        dedup_window_ms=call.dedup_window_ms,
        finality=call.finality,
    )
    decision = decide_recovery(record, now=now, lookup=lookup)
    if isinstance(decision, NeedsLookup) and tool.reconcile is None:
        # The call was recorded as reconcilable, but the tool has since been redefined without a
        # lookup (a deploy changed its effect): there is nothing to ask, so never guess.
        return Park(
            f"tool {call.tool!r} was interrupted mid-call as reconcilable and no longer has a reconcile "
            "lookup: a person must decide"
        )
    if isinstance(decision, AlreadySettled):
        return Skip("call already settled")
    if isinstance(decision, Wait):
        return Busy(decision.until)
    return decision


# -- what runs next ----------------------------------------------------------------------------
#
# After a commit moves a run on, the same commit records the one task that runs next (its outbox
# row). These functions say which, from the committed call or reply alone; the committing shell
# turns the answer into the outbox row (it knows the queues, and may have the next call's row).


@dataclass(frozen=True, slots=True)
class NextCall:
    """Dispatch the call at ``index`` of the same model reply (when it opens a concurrent group,
    the group's first wave)."""

    index: int


@dataclass(frozen=True, slots=True)
class NextStep:
    """Every call of the reply has its result: ask the model again, at the run's current step."""


@dataclass(frozen=True, slots=True)
class FinishRun:
    """End the run ``completed``: the model replied without calls, or a call ended the turn."""


WhatRunsNext = NextCall | NextStep | FinishRun
"""Every answer the functions below can give."""


def after_reply(calls: int) -> NextCall | FinishRun:
    """After a model step committed a reply with ``calls`` tool calls: its first call, or the end."""
    return NextCall(0) if calls > 0 else FinishRun()


def after_results(shown: int, calls_in_step: int) -> NextCall | NextStep:
    """After the results of a reply's first ``shown`` calls (of ``calls_in_step``) are recorded,
    in order: the call after them, or the next model step once every call has its result."""
    return NextCall(shown) if shown < calls_in_step else NextStep()


def after_call(call: CallRow, *, ends_turn: bool) -> WhatRunsNext:
    """After ``call``'s result is committed in order. ``ends_turn``: the call succeeded and its
    tool ends the turn, so the run finishes (the calls after it are skipped)."""
    if ends_turn:
        return FinishRun()
    return after_results(call.index + 1, call.calls_in_step)
