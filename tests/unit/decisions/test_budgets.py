"""Agent-tool budget expiry as a pure decision: every branch, at and around each deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest

from threads_celery.decisions.budgets import (
    INSPECT_TIMEOUT_S,
    RECOVERY_DEADLINE_S,
    CheckAt,
    Finding,
    InspectChild,
    Interrupt,
    TearDown,
    check_at,
    decide_budget,
    interruption_for,
)

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def decide(**overrides: Any) -> Any:
    """A detached run started 10 s ago, last heard from 1 s ago, with no budgets unless told."""
    fields: dict[str, Any] = {
        "started_at": NOW - timedelta(seconds=10),
        "last_signal_at": NOW - timedelta(seconds=1),
        "max_budget_ms": None,
        "no_progress_budget_ms": None,
        "detached": True,
        "now": NOW,
    }
    return decide_budget(**{**fields, **overrides})


def test_a_run_without_budgets_is_never_looked_at_again() -> None:
    assert decide() == CheckAt(None)


def test_a_detached_run_past_its_total_budget_is_torn_down_as_budget_exceeded() -> None:
    assert decide(max_budget_ms=5_000) == TearDown(
        Interrupt("budget-exceeded", "agent tool run exceeded its budget of 5000 ms", child_still_running=False)
    )


def test_an_awaited_run_past_its_window_is_torn_down_as_window_exceeded() -> None:
    assert decide(max_budget_ms=5_000, detached=False) == TearDown(
        Interrupt(
            "window-exceeded",
            "agent tool run exceeded the parent's maximum window of 5000 ms",
            child_still_running=False,
        )
    )


def test_the_total_budget_runs_out_at_its_deadline_instant() -> None:
    assert isinstance(decide(max_budget_ms=10_000), TearDown)
    assert decide(max_budget_ms=10_001) == CheckAt(NOW + timedelta(milliseconds=1))


def test_a_run_without_a_start_time_counts_from_now() -> None:
    assert decide(started_at=None, max_budget_ms=1) == CheckAt(NOW + timedelta(milliseconds=1))


def test_a_run_silent_past_its_no_progress_budget_has_its_child_inspected() -> None:
    assert decide(no_progress_budget_ms=500) == InspectChild()


def test_the_no_progress_budget_runs_out_at_its_deadline_instant() -> None:
    assert decide(no_progress_budget_ms=1_000) == InspectChild()
    assert decide(no_progress_budget_ms=1_001) == CheckAt(NOW + timedelta(milliseconds=1))


def test_a_run_never_signalled_is_not_silent() -> None:
    assert decide(last_signal_at=None, no_progress_budget_ms=1) == CheckAt(None)


def test_the_total_budget_wins_over_silence() -> None:
    assert isinstance(decide(max_budget_ms=1, no_progress_budget_ms=1), TearDown)


def test_within_both_budgets_it_is_looked_at_when_the_first_runs_out() -> None:
    decision = decide(max_budget_ms=60_000, no_progress_budget_ms=30_000)
    assert decision == CheckAt(NOW - timedelta(seconds=1) + timedelta(seconds=30))
    decision = decide(max_budget_ms=20_000, no_progress_budget_ms=30_000)
    assert decision == CheckAt(NOW - timedelta(seconds=10) + timedelta(seconds=20))


def test_check_at_is_the_earliest_deadline() -> None:
    started, signal = NOW, NOW + timedelta(seconds=5)
    assert check_at(started=started, last_signal=signal, max_budget_ms=None, no_progress_ms=None) is None
    assert check_at(started=started, last_signal=None, max_budget_ms=None, no_progress_ms=1_000) is None
    assert check_at(started=started, last_signal=signal, max_budget_ms=2_000, no_progress_ms=None) == NOW + timedelta(
        seconds=2
    )
    assert check_at(started=started, last_signal=signal, max_budget_ms=9_000, no_progress_ms=1_000) == NOW + timedelta(
        seconds=6
    )


@pytest.mark.parametrize(
    ("finding", "expected"),
    [
        ("ended", None),
        ("silent", Interrupt("no-progress", "agent tool run made no progress for 750 ms", child_still_running=True)),
        ("gone", Interrupt("not-tailable", "the child run cannot be found to follow", child_still_running=False)),
        ("failed", Interrupt("inspect-failed", "inspecting the child run failed", child_still_running=None)),
        (
            "slow",
            Interrupt(
                "inspect-timeout",
                f"inspecting the child run took over {INSPECT_TIMEOUT_S:g} s",
                child_still_running=None,
            ),
        ),
        (
            "late",
            Interrupt(
                "recovery-deadline",
                f"the recovery pass ran past its {RECOVERY_DEADLINE_S:g} s deadline",
                child_still_running=None,
            ),
        ),
    ],
)
def test_a_silent_run_is_sealed_by_what_its_inspection_found(finding: Finding, expected: Interrupt | None) -> None:
    assert interruption_for(finding, no_progress_budget_ms=750) == expected


def test_every_finding_has_an_answer() -> None:
    assert set(get_args(Finding)) == {"ended", "silent", "gone", "failed", "slow", "late"}
