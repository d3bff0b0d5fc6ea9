"""The recovery decision over every effect and call state (its lookup shell: test_reconcile_lookup.py).

Conventions under test:
- a lease is live while ``now < lease_expires_at``; at the expiry instant it has expired;
- an idempotent call is inside its dedup window while ``now - first_started_at < window``;
  exactly at the boundary it is outside and parks.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from threads_celery.decisions.effects import (
    CALL_STATUSES,
    EFFECTS,
    AlreadySettled,
    CallRecord,
    CallStatus,
    Effect,
    Found,
    LookupFailed,
    LookupUnknown,
    NeedsLookup,
    NotFound,
    Park,
    Reconcile,
    RecordFound,
    RunAgain,
    Wait,
    decide_recovery,
)
from threads_celery.exceptions import ConfigError

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
WINDOW_MS = 60_000
PERSON = "a person must decide (assume_done or assume_not_done)"


def call(
    effect: Effect,
    *,
    status: CallStatus = "started",
    attempt: int = 1,
    first_started_at: datetime | None = NOW - timedelta(seconds=5),
    lease_expires_at: datetime | None = NOW - timedelta(seconds=1),
    dedup_window_ms: int | None = None,
    finality: Any = None,
) -> CallRecord:
    """A call that started and whose lease expired, unless told otherwise."""
    if effect == "idempotent" and dedup_window_ms is None:
        dedup_window_ms = WINDOW_MS
    if effect == "reconcilable" and finality is None:
        finality = "final"
    return CallRecord(
        effect_key="call-1",
        effect=effect,
        status=status,
        attempt=attempt,
        first_started_at=first_started_at,
        lease_expires_at=lease_expires_at,
        dedup_window_ms=dedup_window_ms,
        finality=finality,
    )


def never_started(effect: Effect) -> CallRecord:
    return call(effect, status="pending", attempt=0, first_started_at=None, lease_expires_at=None)


# --- the names --------------------------------------------------------------------------------


def test_effects_tuple_lists_the_four_effects_of_the_literal() -> None:
    assert EFFECTS == ("read_only", "idempotent", "reconcilable", "unguarded")
    assert get_args(Effect) == EFFECTS


def test_call_statuses_tuple_matches_the_literal() -> None:
    assert CALL_STATUSES == ("pending", "started", "completed", "error", "parked")


# --- the matrix: every effect x every call state ------------------------------------------------


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_call_that_never_started_runs_whatever_its_effect(effect: Effect) -> None:
    decision = decide_recovery(never_started(effect), now=NOW)
    assert isinstance(decision, RunAgain)
    assert "never started" in decision.reason


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_never_started_reconcilable_call_does_not_need_a_lookup(effect: Effect) -> None:
    # The lookup is only for calls that may have happened.
    assert not isinstance(decide_recovery(never_started(effect), now=NOW), NeedsLookup)


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("status", ["pending", "started"])
def test_a_call_with_a_live_lease_waits_whatever_its_effect(effect: Effect, status: CallStatus) -> None:
    expiry = NOW + timedelta(seconds=30)
    decision = decide_recovery(call(effect, status=status, lease_expires_at=expiry), now=NOW)
    assert decision == Wait(until=expiry)


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_live_lease_wins_over_a_lookup_answer(effect: Effect) -> None:
    expiry = NOW + timedelta(milliseconds=1)
    decision = decide_recovery(call(effect, lease_expires_at=expiry), now=NOW, lookup=NotFound())
    assert decision == Wait(until=expiry)


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_lease_expires_at_its_expiry_instant(effect: Effect) -> None:
    decision = decide_recovery(call(effect, lease_expires_at=NOW), now=NOW)
    assert not isinstance(decision, Wait)


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_lease_one_millisecond_from_expiry_is_still_live(effect: Effect) -> None:
    expiry = NOW + timedelta(milliseconds=1)
    assert decide_recovery(call(effect, lease_expires_at=expiry), now=NOW) == Wait(until=expiry)


@pytest.mark.parametrize(
    ("effect", "expected"),
    [
        ("read_only", RunAgain),
        ("idempotent", RunAgain),  # 5 s after its first start, inside the 60 s window
        ("reconcilable", NeedsLookup),
        ("unguarded", Park),
    ],
)
@pytest.mark.parametrize("lease_expires_at", [NOW - timedelta(seconds=1), None], ids=["expired", "no-lease"])
def test_a_started_call_whose_lease_expired_is_settled_by_its_effect(
    effect: Effect, expected: type, lease_expires_at: datetime | None
) -> None:
    decision = decide_recovery(call(effect, lease_expires_at=lease_expires_at), now=NOW)
    assert isinstance(decision, expected)


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("status", ["completed", "error"])
@pytest.mark.parametrize(
    "lease_expires_at",
    [NOW - timedelta(seconds=1), NOW + timedelta(seconds=1), None],
    ids=["expired", "live", "none"],
)
def test_a_settled_call_needs_nothing(effect: Effect, status: CallStatus, lease_expires_at: datetime | None) -> None:
    record = call(effect, status=status, lease_expires_at=lease_expires_at)
    decision = decide_recovery(record, now=NOW, lookup=NotFound())
    assert decision == AlreadySettled()


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_parked_call_stays_parked_for_a_person(effect: Effect) -> None:
    decision = decide_recovery(call(effect, status="parked"), now=NOW, lookup=Found("x"))
    assert isinstance(decision, Park)
    assert "already parked" in decision.reason
    assert effect in decision.reason
    assert PERSON in decision.reason


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize(
    "evidence",
    [
        {"status": "pending", "attempt": 1, "first_started_at": None},
        {"status": "pending", "attempt": 0, "first_started_at": NOW - timedelta(seconds=1)},
        {"status": "started", "attempt": 0, "first_started_at": None},
    ],
    ids=["attempt-only", "first-start-only", "status-only"],
)
def test_any_single_sign_of_a_start_counts_as_a_start(effect: Effect, evidence: dict[str, Any]) -> None:
    record = call(effect, lease_expires_at=None, **evidence)
    assert record.may_have_started
    decision = decide_recovery(record, now=NOW)
    if effect == "unguarded":
        assert isinstance(decision, Park)
    assert not (isinstance(decision, RunAgain) and "never started" in decision.reason)


def test_an_interrupted_read_only_call_runs_again() -> None:
    decision = decide_recovery(call("read_only"), now=NOW)
    assert isinstance(decision, RunAgain)
    assert "read_only" in decision.reason


def test_an_interrupted_unguarded_call_parks_with_a_clear_reason() -> None:
    decision = decide_recovery(call("unguarded"), now=NOW)
    assert decision == Park(f"unguarded tool interrupted mid-call: {PERSON}")


@pytest.mark.parametrize("answer", [Found("x"), NotFound(), LookupUnknown("?"), LookupFailed("boom")])
@pytest.mark.parametrize("effect", ["read_only", "idempotent", "unguarded"])
def test_a_lookup_answer_is_ignored_for_effects_that_have_no_lookup(effect: Effect, answer: Any) -> None:
    assert decide_recovery(call(effect), now=NOW, lookup=answer) == decide_recovery(call(effect), now=NOW)


# --- idempotent: the dedup window ---------------------------------------------------------------


def idempotent_started(ago: timedelta, *, window_ms: int | None = WINDOW_MS) -> CallRecord:
    return replace(call("idempotent", first_started_at=NOW - ago), dedup_window_ms=window_ms)


def test_idempotent_one_millisecond_inside_the_window_runs_again_with_the_same_key() -> None:
    decision = decide_recovery(idempotent_started(timedelta(milliseconds=WINDOW_MS - 1)), now=NOW)
    assert isinstance(decision, RunAgain)
    assert "inside its dedup window of 60000 ms" in decision.reason


def test_idempotent_exactly_at_the_window_boundary_parks() -> None:
    decision = decide_recovery(idempotent_started(timedelta(milliseconds=WINDOW_MS)), now=NOW)
    assert isinstance(decision, Park)


def test_idempotent_one_millisecond_past_the_window_parks_with_a_clear_reason() -> None:
    first = NOW - timedelta(milliseconds=WINDOW_MS + 1)
    decision = decide_recovery(idempotent_started(timedelta(milliseconds=WINDOW_MS + 1)), now=NOW)
    assert isinstance(decision, Park)
    assert decision.reason.startswith(
        f"idempotent call's dedup window of 60000 ms has passed since its first start at {first.isoformat()}"
    )
    assert PERSON in decision.reason


def test_idempotent_window_is_measured_from_the_first_start_not_the_latest_attempt() -> None:
    # Attempt 3, the latest start a second ago, but the first start was past the window.
    record = CallRecord(
        effect_key="call-1",
        effect="idempotent",
        status="started",
        attempt=3,
        first_started_at=NOW - timedelta(milliseconds=WINDOW_MS + 1),
        lease_expires_at=NOW - timedelta(milliseconds=1),
        dedup_window_ms=WINDOW_MS,
    )
    assert isinstance(decide_recovery(record, now=NOW), Park)


def test_idempotent_with_a_zero_window_always_parks() -> None:
    assert isinstance(decide_recovery(idempotent_started(timedelta(0), window_ms=0), now=NOW), Park)


def test_idempotent_without_a_recorded_window_parks() -> None:
    decision = decide_recovery(idempotent_started(timedelta(seconds=1), window_ms=None), now=NOW)
    assert isinstance(decision, Park)
    assert "no dedup window" in decision.reason


def test_idempotent_without_a_first_start_time_parks() -> None:
    decision = decide_recovery(call("idempotent", attempt=1, first_started_at=None), now=NOW)
    assert isinstance(decision, Park)
    assert "no first start time" in decision.reason


# --- reconcilable: finality x lookup answer ------------------------------------------------------


@pytest.mark.parametrize("finality", ["final", "nonfinal"])
def test_reconcilable_without_an_answer_needs_a_lookup(finality: str) -> None:
    assert decide_recovery(call("reconcilable", finality=finality), now=NOW) == NeedsLookup()


@pytest.mark.parametrize("finality", ["final", "nonfinal"])
def test_reconcilable_found_records_the_value_without_running(finality: str) -> None:
    value = {"charge_id": "ch_1"}
    decision = decide_recovery(call("reconcilable", finality=finality), now=NOW, lookup=Found(value))
    assert decision == RecordFound(value)


def test_reconcilable_final_not_found_runs_again() -> None:
    decision = decide_recovery(call("reconcilable", finality="final"), now=NOW, lookup=NotFound())
    assert isinstance(decision, RunAgain)
    assert "final" in decision.reason


def test_reconcilable_nonfinal_not_found_parks_as_not_yet_known() -> None:
    decision = decide_recovery(call("reconcilable", finality="nonfinal"), now=NOW, lookup=NotFound())
    assert isinstance(decision, Park)
    assert "nonfinal" in decision.reason
    assert PERSON in decision.reason


def test_reconcilable_not_found_without_a_recorded_finality_parks() -> None:
    record = replace(call("reconcilable"), finality=None)
    decision = decide_recovery(record, now=NOW, lookup=NotFound())
    assert isinstance(decision, Park)
    assert "no finality" in decision.reason


@pytest.mark.parametrize("finality", ["final", "nonfinal"])
def test_reconcilable_unknown_parks_with_the_lookups_reason(finality: str) -> None:
    decision = decide_recovery(
        call("reconcilable", finality=finality), now=NOW, lookup=LookupUnknown("provider is degraded")
    )
    assert isinstance(decision, Park)
    assert "provider is degraded" in decision.reason
    assert "reconcilable" in decision.reason


@pytest.mark.parametrize("finality", ["final", "nonfinal"])
def test_reconcilable_failed_lookup_parks_with_the_failure(finality: str) -> None:
    failure = LookupFailed("lookup did not answer within 10 s")
    decision = decide_recovery(call("reconcilable", finality=finality), now=NOW, lookup=failure)
    assert isinstance(decision, Park)
    assert "lookup did not answer within 10 s" in decision.reason


# --- the records validate themselves ------------------------------------------------------------


@pytest.mark.parametrize("finality", ["maybe", "", None, "FINAL"])
def test_reconcile_with_a_bad_finality_is_a_config_error(finality: Any) -> None:
    with pytest.raises(ConfigError, match="finality"):
        Reconcile(finality=finality, lookup=lambda key: NotFound())


def test_reconcile_with_a_lookup_that_is_not_callable_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="callable"):
        Reconcile(finality="final", lookup="not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan"), True, "10"])
def test_reconcile_with_a_bad_timeout_is_a_config_error(timeout_s: Any) -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        Reconcile(finality="final", lookup=lambda key: NotFound(), timeout_s=timeout_s)


def test_reconcile_defaults_to_a_ten_second_timeout() -> None:
    assert Reconcile(finality="nonfinal", lookup=lambda key: NotFound()).timeout_s == 10.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("effect", "risky"),
        ("status", "running"),
        ("finality", "maybe"),
        ("attempt", -1),
        ("dedup_window_ms", -1),
    ],
)
def test_a_malformed_call_record_is_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        replace(call("read_only"), **{field: value})


def test_decision_values_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Park("x").reason = "y"  # type: ignore[misc]


# --- properties ---------------------------------------------------------------------------------

_instants = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
_answers = st.one_of(
    st.none(),
    st.builds(Found, st.integers()),
    st.just(NotFound()),
    st.builds(LookupUnknown, st.text(max_size=20)),
    st.builds(LookupFailed, st.text(max_size=20)),
)


@st.composite
def started_calls(
    draw: st.DrawFn, *, effect: st.SearchStrategy[Effect], lease_live: bool
) -> tuple[CallRecord, datetime]:
    """A call with at least one sign of a start, not settled or parked, and a ``now``."""
    now = draw(_instants)
    offset = timedelta(milliseconds=draw(st.integers(min_value=0, max_value=10**9)))
    if lease_live:
        lease: datetime | None = now + offset + timedelta(milliseconds=1)
    else:
        lease = draw(st.one_of(st.none(), st.just(now - offset)))
    status = draw(st.sampled_from(["pending", "started"]))
    attempt = draw(st.integers(min_value=0, max_value=50))
    first_started_at = draw(st.one_of(st.none(), _instants))
    if status == "pending" and attempt == 0 and first_started_at is None:
        attempt = 1  # make sure there is a sign of a start
    record = CallRecord(
        effect_key=draw(st.text(min_size=1, max_size=20)),
        effect=draw(effect),
        status=status,
        attempt=attempt,
        first_started_at=first_started_at,
        lease_expires_at=lease,
        dedup_window_ms=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=10**10))),
        finality=draw(st.sampled_from([None, "final", "nonfinal"])),
    )
    return record, now


@given(started_calls(effect=st.just("unguarded"), lease_live=False), _answers)
def test_property_an_interrupted_unguarded_call_always_parks(case: tuple[CallRecord, datetime], answer: Any) -> None:
    record, now = case
    assert isinstance(decide_recovery(record, now=now, lookup=answer), Park)


@given(started_calls(effect=st.sampled_from(EFFECTS), lease_live=True), _answers)
def test_property_a_started_call_with_a_live_lease_never_runs_again(
    case: tuple[CallRecord, datetime], answer: Any
) -> None:
    record, now = case
    decision = decide_recovery(record, now=now, lookup=answer)
    assert not isinstance(decision, RunAgain)
    assert decision == Wait(until=record.lease_expires_at)
