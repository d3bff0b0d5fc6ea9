"""The step machine's pure decisions: ``decide_step`` and ``decide_call`` over hand-built records.

No database, no Celery: a delivery of ``threads.step`` or ``threads.tool`` is decided from the
run's and the call's ledger rows and the caller's clock alone.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from threads_celery import Found, LookupUnknown, NotFound, Reconcile, tool
from threads_celery.decisions.effects import LookupFailed, NeedsLookup, Park, RecordFound, RunAgain
from threads_celery.records import TERMINAL_STATUSES, CallRow, Run
from threads_celery.runtime.machine import Busy, Proceed, Skip, decide_call, decide_step

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)
EARLIER = NOW - timedelta(seconds=30)
WINDOW_MS = 60_000


class Args(BaseModel):
    value: str = ""


def _never(inp: Any, ctx: Any) -> str:  # decisions never call tools
    raise AssertionError("a decision called the tool")


def _lookup(effect_key: str) -> Any:
    raise AssertionError("a decision called the lookup")


def make_tool(effect: str = "unguarded", **options: Any) -> Any:
    if effect == "idempotent":
        options.setdefault("dedup_window_ms", WINDOW_MS)
    if effect == "reconcilable":
        options.setdefault("reconcile", Reconcile(finality="final", lookup=_lookup))
    return tool(name="act", description="Do it.", input=Args, execute=_never, effect=effect, **options)


def make_run(**overrides: Any) -> Run:
    values: dict[str, Any] = {
        "id": "run_1",
        "thread_id": "thread_1",
        "agent": "agent",
        "status": "running",
        "step": 3,
        "fence": 7,
        "input": "hello",
    }
    values.update(overrides)
    return Run(**values)


def make_call(**overrides: Any) -> CallRow:
    values: dict[str, Any] = {
        "effect_key": "run_1:2:0",
        "run_id": "run_1",
        "thread_id": "thread_1",
        "step": 2,  # the run is at step 3: the calls of step 2 are due
        "index": 0,
        "call_id": "call_1",
        "tool": "act",
        "args": "{}",
        "status": "pending",
        "attempt": 0,
        "effect": "unguarded",
    }
    values.update(overrides)
    return CallRow(**values)


def started(effect: str, **overrides: Any) -> CallRow:
    """A call whose worker claimed it and then went silent past its lease."""
    values: dict[str, Any] = {
        "effect": effect,
        "status": "started",
        "attempt": 1,
        "first_started_at": NOW - timedelta(seconds=10),
        "lease_expires_at": EARLIER,
    }
    # What the ledger pinned when the call was recorded.
    if effect == "idempotent":
        values["dedup_window_ms"] = WINDOW_MS
    if effect == "reconcilable":
        values["finality"] = "final"
    values.update(overrides)
    return make_call(**values)


# -- decide_step --------------------------------------------------------------------------------


def test_a_step_of_no_run_is_skipped() -> None:
    assert decide_step(None, 0, NOW) == Skip("no such run")


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
def test_a_step_of_an_ended_run_is_skipped(status: str) -> None:
    decision = decide_step(make_run(status=status, step=0), 0, NOW)
    assert decision == Skip(f"run is {status}")


@pytest.mark.parametrize("step", [0, 2, 4])
def test_a_stale_or_early_step_is_skipped(step: int) -> None:
    decision = decide_step(make_run(step=3), step, NOW)
    assert decision == Skip(f"step {step} is not due (the run is at step 3)")


@pytest.mark.parametrize("status", ["parked", "waiting", "awaiting_approval", "awaiting_variable"])
def test_a_step_of_a_run_that_waits_is_skipped(status: str) -> None:
    assert decide_step(make_run(status=status), 3, NOW) == Skip(f"run is {status}")


@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_due_step_of_a_free_run_proceeds(status: str) -> None:
    assert decide_step(make_run(status=status, step=3), 3, NOW) == Proceed()


def test_a_step_of_a_run_whose_lease_is_held_is_busy_until_it_expires() -> None:
    run = make_run(lease_owner="worker-a", lease_expires_at=LATER)
    assert decide_step(run, 3, NOW) == Busy(LATER)


def test_a_step_of_a_run_whose_lease_expired_proceeds() -> None:
    run = make_run(lease_owner="worker-a", lease_expires_at=EARLIER)
    assert decide_step(run, 3, NOW) == Proceed()


def test_a_lease_expires_at_its_expiry_instant() -> None:
    run = make_run(lease_owner="worker-a", lease_expires_at=NOW)
    assert decide_step(run, 3, NOW) == Proceed()


def test_an_expiry_without_an_owner_is_no_lease() -> None:
    run = make_run(lease_owner=None, lease_expires_at=LATER)
    assert decide_step(run, 3, NOW) == Proceed()


def test_the_run_state_is_checked_before_the_lease() -> None:
    # A held lease on an ended run or a stale step still skips: nothing will ever be due.
    held = {"lease_owner": "worker-a", "lease_expires_at": LATER}
    assert isinstance(decide_step(make_run(status="completed", **held), 3, NOW), Skip)
    assert isinstance(decide_step(make_run(**held), 2, NOW), Skip)


# -- decide_call: the run and the call's own state -----------------------------------------------


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
def test_a_call_of_an_ended_run_is_skipped(status: str) -> None:
    assert decide_call(make_call(), make_run(status=status), NOW, make_tool()) == Skip(f"run is {status}")


@pytest.mark.parametrize("status", ["completed", "error", "skipped"])
def test_a_settled_call_is_skipped(status: str) -> None:
    call = make_call(status=status, attempt=1, result="done")
    assert decide_call(call, make_run(), NOW, make_tool()) == Skip("call already settled")


def test_a_parked_call_is_skipped_not_rerun() -> None:
    call = make_call(status="parked", attempt=1, first_started_at=EARLIER, park_reason="unguarded")
    assert decide_call(call, make_run(status="parked"), NOW, make_tool()) == Skip("call is parked")
    # Even with the run still marked running, a parked call waits for a person.
    assert decide_call(call, make_run(), NOW, make_tool("read_only")) == Skip("call is parked")


@pytest.mark.parametrize("status", ["queued", "parked", "waiting", "awaiting_approval"])
def test_a_call_of_a_run_that_is_not_running_is_skipped(status: str) -> None:
    assert decide_call(make_call(), make_run(status=status), NOW, make_tool()) == Skip(f"run is {status}")


@pytest.mark.parametrize("run_step", [2, 4, 9])
def test_a_call_of_a_step_that_is_not_current_is_skipped(run_step: int) -> None:
    decision = decide_call(make_call(step=2), make_run(step=run_step), NOW, make_tool())
    assert decision == Skip("call belongs to a step that is not current")


def test_a_call_whose_run_lease_is_held_is_busy() -> None:
    run = make_run(lease_owner="worker-a", lease_expires_at=LATER)
    assert decide_call(make_call(), run, NOW, make_tool()) == Busy(LATER)


@pytest.mark.parametrize("effect", ["read_only", "idempotent", "reconcilable", "unguarded"])
def test_a_fresh_call_proceeds_whatever_its_effect(effect: str) -> None:
    call = make_call(effect=effect)
    assert decide_call(call, make_run(), NOW, make_tool(effect)) == Proceed()


def test_a_fresh_call_proceeds_once_the_run_lease_expired() -> None:
    run = make_run(lease_owner="worker-a", lease_expires_at=EARLIER)
    assert decide_call(make_call(), run, NOW, make_tool()) == Proceed()


def test_a_fresh_call_of_an_unknown_tool_proceeds_so_the_model_hears_of_it() -> None:
    assert decide_call(make_call(tool="nope"), make_run(), NOW, None) == Proceed()


# -- decide_call: recovery of a call that may have started ---------------------------------------


def test_a_started_call_whose_own_lease_is_live_waits() -> None:
    call = started("unguarded", lease_expires_at=LATER)
    assert decide_call(call, make_run(), NOW, make_tool()) == Busy(LATER)


def test_an_interrupted_read_only_call_runs_again() -> None:
    decision = decide_call(started("read_only"), make_run(), NOW, make_tool("read_only"))
    assert isinstance(decision, RunAgain)
    assert "read_only" in decision.reason


def test_an_interrupted_unguarded_call_parks() -> None:
    decision = decide_call(started("unguarded"), make_run(), NOW, make_tool("unguarded"))
    assert isinstance(decision, Park)
    assert "unguarded" in decision.reason
    assert "a person must decide" in decision.reason


def test_an_unguarded_call_with_only_an_attempt_count_still_parks() -> None:
    # A half-written row (attempt bumped, status not yet moved) is still evidence of a start.
    call = make_call(status="pending", attempt=1, first_started_at=None, lease_expires_at=None)
    assert isinstance(decide_call(call, make_run(), NOW, make_tool()), Park)


def test_an_interrupted_idempotent_call_inside_its_window_runs_again() -> None:
    call = started("idempotent", first_started_at=NOW - timedelta(milliseconds=WINDOW_MS - 1))
    decision = decide_call(call, make_run(), NOW, make_tool("idempotent"))
    assert isinstance(decision, RunAgain)
    assert "inside its dedup window" in decision.reason


def test_an_interrupted_idempotent_call_outside_its_window_parks() -> None:
    call = started("idempotent", first_started_at=NOW - timedelta(milliseconds=WINDOW_MS + 1))
    decision = decide_call(call, make_run(), NOW, make_tool("idempotent"))
    assert isinstance(decision, Park)
    assert "dedup window" in decision.reason


def test_an_idempotent_window_is_measured_from_the_first_start() -> None:
    # A later attempt does not restart the window: attempt 3, first start long ago.
    call = started("idempotent", attempt=3, first_started_at=NOW - timedelta(hours=1))
    assert isinstance(decide_call(call, make_run(), NOW, make_tool("idempotent")), Park)


def test_the_idempotent_window_is_the_one_pinned_on_the_call_not_the_current_tools() -> None:
    # A deploy that widened the tool's window does not widen it for calls already recorded.
    call = started("idempotent", first_started_at=NOW - timedelta(seconds=90))
    wide = make_tool("idempotent", dedup_window_ms=120_000)
    assert isinstance(decide_call(call, make_run(), NOW, wide), Park)
    pinned_wide = started("idempotent", first_started_at=NOW - timedelta(seconds=90), dedup_window_ms=120_000)
    assert isinstance(decide_call(pinned_wide, make_run(), NOW, make_tool("idempotent")), RunAgain)


def test_an_idempotent_call_whose_tool_is_gone_parks() -> None:
    # Without the tool there is no dedup window to check: never guess.
    assert isinstance(decide_call(started("idempotent"), make_run(), NOW, None), Park)


def test_an_interrupted_reconcilable_call_needs_a_lookup_first() -> None:
    decision = decide_call(started("reconcilable"), make_run(), NOW, make_tool("reconcilable"))
    assert decision == NeedsLookup()


def test_a_reconcilable_lookup_that_found_the_call_records_its_value() -> None:
    call = started("reconcilable")
    decision = decide_call(call, make_run(), NOW, make_tool("reconcilable"), lookup=Found({"id": "ch_1"}))
    assert decision == RecordFound({"id": "ch_1"})


def test_a_final_not_found_runs_again() -> None:
    decision = decide_call(started("reconcilable"), make_run(), NOW, make_tool("reconcilable"), lookup=NotFound())
    assert isinstance(decision, RunAgain)


def test_a_nonfinal_not_found_parks() -> None:
    tool_ = make_tool("reconcilable", reconcile=Reconcile(finality="nonfinal", lookup=_lookup))
    decision = decide_call(started("reconcilable", finality="nonfinal"), make_run(), NOW, tool_, lookup=NotFound())
    assert isinstance(decision, Park)
    assert "nonfinal" in decision.reason


@pytest.mark.parametrize("answer", [LookupUnknown("provider is down"), LookupFailed("lookup raised KeyError")])
def test_a_lookup_without_an_answer_parks(answer: Any) -> None:
    decision = decide_call(started("reconcilable"), make_run(), NOW, make_tool("reconcilable"), lookup=answer)
    assert isinstance(decision, Park)
    assert answer.reason in decision.reason


def test_a_recovery_is_never_decided_while_the_run_lease_is_held() -> None:
    run = make_run(lease_owner="worker-a", lease_expires_at=LATER)
    assert decide_call(started("read_only"), run, NOW, make_tool("read_only")) == Busy(LATER)
    assert decide_call(started("unguarded"), run, NOW, make_tool()) == Busy(LATER)


def test_the_decision_reads_the_effect_recorded_with_the_call() -> None:
    # The ledger row's effect is what was pinned when the call was recorded.
    call = started("unguarded")
    assert isinstance(decide_call(call, make_run(), NOW, make_tool("read_only")), Park)
    assert isinstance(decide_call(replace(call, effect="read_only"), make_run(), NOW, make_tool()), RunAgain)


@pytest.mark.parametrize("effect", ["read_only", "idempotent", "unguarded"])
def test_a_reconcilable_call_whose_tool_lost_its_lookup_parks(effect: str) -> None:
    # A deploy redefined the tool with another effect after the call was recorded as reconcilable:
    # there is no lookup to run, so the call parks instead of reaching the runtime as NeedsLookup
    # (which used to fail an assertion in Runtime.run_tool and leave the delivery crashing).
    decision = decide_call(started("reconcilable"), make_run(), NOW, make_tool(effect))
    assert isinstance(decision, Park)
    assert "no longer has a reconcile lookup" in decision.reason
