"""Agent-tool budgets: when an active child run has run out of time, and what it is sealed as.

An agent-tool run may carry two budgets, both recorded on its row when it was dispatched:

- ``max_budget_ms``, counted from its start: a detached run that exceeds it is interrupted as
  ``budget-exceeded``; an awaited run, whose budget is its parent's maximum window, as
  ``window-exceeded``;
- ``no_progress_budget_ms``, counted from its last signal (a step, a tool's heartbeat, a
  milestone): a child silent for longer is looked at first (see :data:`Finding`), then sealed
  by what the look found.

The backbone's pass (:func:`threads_celery.runtime.delivery.reconcile_agent_tools`) loads each
due row, asks :func:`decide_budget`, inspects a silent child when told to, asks
:func:`interruption_for` with the finding, and applies the answer. Nothing here reads a clock
or the ledger: ``now`` and the row's fields are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, TypeAlias, assert_never

__all__ = [
    "INSPECT_TIMEOUT_S",
    "RECOVERY_DEADLINE_S",
    "BudgetDecision",
    "CheckAt",
    "Finding",
    "InspectChild",
    "Interrupt",
    "TearDown",
    "check_at",
    "decide_budget",
    "interruption_for",
]

#: An inspection of one child that takes longer than this is an inspect-timeout.
INSPECT_TIMEOUT_S = 2.0
#: A recovery pass that runs longer than this seals what is left as recovery-deadline.
RECOVERY_DEADLINE_S = 5.0

Finding: TypeAlias = Literal["ended", "silent", "gone", "failed", "slow", "late"]
"""What looking at a silent child's own run record found: it ended (its finish is delivered on
its own), it is still running but silent, its record is gone, the look failed or was slow, or
the recovery pass had run past its deadline before looking."""


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Seal the run as interrupted with ``reason`` (a stable code) and ``error`` (a sentence).

    ``child_still_running``: True when the child is known to run on, False when it is known to
    be stopped or gone, None when it cannot be told.
    """

    reason: str
    error: str
    child_still_running: bool | None


@dataclass(frozen=True, slots=True)
class TearDown:
    """The run exceeded its total budget: cancel the child, then seal it with ``interrupt``
    (whose child is then known to be stopped)."""

    interrupt: Interrupt


@dataclass(frozen=True, slots=True)
class InspectChild:
    """The run has been silent past its no-progress budget: look at its child before sealing it."""


@dataclass(frozen=True, slots=True)
class CheckAt:
    """Within its budgets: look at the run again at ``at`` (None: it has no budget to run out)."""

    at: datetime | None


BudgetDecision: TypeAlias = TearDown | InspectChild | CheckAt
"""Every answer :func:`decide_budget` can give."""


def check_at(
    *, started: datetime, last_signal: datetime | None, max_budget_ms: int | None, no_progress_ms: int | None
) -> datetime | None:
    """When the backbone must look at a run next: the earliest budget that can run out."""
    due = []
    if max_budget_ms is not None:
        due.append(started + timedelta(milliseconds=max_budget_ms))
    if no_progress_ms is not None and last_signal is not None:
        due.append(last_signal + timedelta(milliseconds=no_progress_ms))
    return min(due) if due else None


def decide_budget(
    *,
    started_at: datetime | None,
    last_signal_at: datetime | None,
    max_budget_ms: int | None,
    no_progress_budget_ms: int | None,
    detached: bool,
    now: datetime,
) -> BudgetDecision:
    """What to do with an active agent-tool run at ``now``, by its budgets.

    The total budget is checked first (a run past both is ``budget-exceeded``, not silent). A
    budget runs out at its deadline instant. A row without a start time counts from ``now``
    (never out of budget yet), as the row's start is recorded with its dispatch.
    """
    started = started_at or now
    if max_budget_ms is not None and started + timedelta(milliseconds=max_budget_ms) <= now:
        if detached:
            interrupt = Interrupt(
                "budget-exceeded",
                f"agent tool run exceeded its budget of {max_budget_ms} ms",
                child_still_running=False,
            )
        else:
            interrupt = Interrupt(
                "window-exceeded",
                f"agent tool run exceeded the parent's maximum window of {max_budget_ms} ms",
                child_still_running=False,
            )
        return TearDown(interrupt)
    if (
        no_progress_budget_ms is not None
        and last_signal_at is not None
        and last_signal_at + timedelta(milliseconds=no_progress_budget_ms) <= now
    ):
        return InspectChild()
    return CheckAt(
        check_at(
            started=started,
            last_signal=last_signal_at,
            max_budget_ms=max_budget_ms,
            no_progress_ms=no_progress_budget_ms,
        )
    )


def interruption_for(finding: Finding, *, no_progress_budget_ms: int | None) -> Interrupt | None:
    """How a silent run is sealed once its child was looked at; None when the child ended
    (its own finish is recorded and delivered, so nothing is sealed)."""
    match finding:
        case "ended":
            return None
        case "silent":
            return Interrupt(
                "no-progress",
                f"agent tool run made no progress for {no_progress_budget_ms} ms",
                child_still_running=True,
            )
        case "gone":
            return Interrupt("not-tailable", "the child run cannot be found to follow", child_still_running=False)
        case "failed":
            return Interrupt("inspect-failed", "inspecting the child run failed", child_still_running=None)
        case "slow":
            return Interrupt(
                "inspect-timeout",
                f"inspecting the child run took over {INSPECT_TIMEOUT_S:g} s",
                child_still_running=None,
            )
        case "late":
            return Interrupt(
                "recovery-deadline",
                f"the recovery pass ran past its {RECOVERY_DEADLINE_S:g} s deadline",
                child_still_running=None,
            )
        case _:
            assert_never(finding)
