"""Recovery decisions: what to do with a tool call whose worker may have died mid-call.

A tool declares an *effect* that says what its call does to the outside world, and that effect
alone decides whether an interrupted call may run again:

============== ================================================================================
effect         after an interruption
============== ================================================================================
read_only      run it again: it changed nothing
idempotent     run it again with the same effect key while inside the provider's dedup window
               (measured from the call's first start); park after it
reconcilable   ask the tool's ``reconcile.lookup`` whether the call happened, then record the
               found result, run again (``finality="final"`` not-found) or park
unguarded      park: a person decides (``assume_done`` or ``assume_not_done``)
============== ================================================================================

Visibility-timeout redelivery, ``acks_late`` requeues and Beat sweeps all end in
:func:`decide_recovery`. It is a *pure* function from a plain :class:`CallRecord` (and, for
reconcilable calls, the lookup's answer) to a :data:`RecoveryDecision` value: it reads no
clock, touches no database or broker and calls no user code. That is what lets every branch be
tested exhaustively without Celery or a database, and lets the task, the Beat sweep and the
tests share one answer. The I/O stays in a thin shell: the caller loads the ledger row, passes
``now``, applies the decision, and, when the decision is :class:`NeedsLookup`, runs the user's
lookup through :func:`threads_celery.runtime.reconcile_lookup.run_lookup` (which bounds it with a
timeout and turns every failure into a :class:`LookupFailed` value) and asks again with the answer.

The promise the decision keeps: a side effect that may have happened is never silently repeated.
Any evidence that a call started counts as a start, and anything the decision cannot check
parks the call instead of guessing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeAlias, assert_never, get_args

from threads_celery.exceptions import ConfigError
from threads_celery.records import Effect, Finality

__all__ = [
    "CALL_STATUSES",
    "EFFECTS",
    "FINALITIES",
    "AlreadySettled",
    "CallRecord",
    "CallStatus",
    "Effect",
    "Finality",
    "Found",
    "LookupAnswer",
    "LookupFailed",
    "LookupUnknown",
    "NeedsLookup",
    "NotFound",
    "Park",
    "Reconcile",
    "RecordFound",
    "RecoveryDecision",
    "RunAgain",
    "Wait",
    "decide_recovery",
]

EFFECTS: tuple[Effect, ...] = get_args(Effect)
"""The four effects, in order from safest to least safe to repeat."""

FINALITIES: tuple[Finality, ...] = get_args(Finality)
"""The two finalities."""

CallStatus: TypeAlias = Literal["pending", "started", "completed", "error", "parked"]
"""A tool call's status in the ledger."""

CALL_STATUSES: tuple[CallStatus, ...] = get_args(CallStatus)
"""The five call statuses."""

_SETTLED_STATUSES: frozenset[CallStatus] = frozenset({"completed", "error"})

_PERSON_DECIDES = "a person must decide (assume_done or assume_not_done)"


# --- the lookup's answers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """The provider has the call with this effect key: ``value`` is its result."""

    value: Any


@dataclass(frozen=True, slots=True)
class NotFound:
    """The provider has no call with this effect key (a proof only with ``finality="final"``)."""


@dataclass(frozen=True, slots=True)
class LookupUnknown:
    """The lookup cannot tell whether the call happened; ``reason`` says why."""

    reason: str


LookupAnswer: TypeAlias = Found | NotFound | LookupUnknown
"""What a reconcile lookup returns."""


@dataclass(frozen=True, slots=True)
class LookupFailed:
    """The lookup gave no answer: it raised, timed out or returned something else.

    Produced by :func:`~threads_celery.runtime.reconcile_lookup.run_lookup`, never by user code; ``reason`` is a sentence without a
    traceback, e.g. ``"lookup did not answer within 10 s"``.
    """

    reason: str


@dataclass(frozen=True, slots=True)
class Reconcile:
    """How to ask the provider whether a reconcilable call happened.

    ``lookup(effect_key)`` returns :class:`Found`, :class:`NotFound` or :class:`LookupUnknown`,
    or an awaitable of one of them. ``finality="final"`` means a not-found answer proves the call
    never happened, so it may run again; with ``"nonfinal"`` a not-found is "not yet known" and
    the call parks. A lookup that has not answered within ``timeout_s`` seconds is given up on.

    Raises :class:`~threads_celery.exceptions.ConfigError` for an unknown finality, a lookup
    that is not callable, or a timeout that is not a positive number.
    """

    finality: Finality
    lookup: Callable[[str], LookupAnswer | Awaitable[LookupAnswer]]
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.finality not in FINALITIES:
            raise ConfigError(f"Reconcile finality must be one of {', '.join(FINALITIES)}, not {self.finality!r}")
        if not callable(self.lookup):
            raise ConfigError(f"Reconcile lookup must be callable, not {type(self.lookup).__name__}")
        # bool is an int: reject it so `timeout_s=True` is not read as one second.
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise ConfigError(f"Reconcile timeout_s must be a positive number of seconds, not {self.timeout_s!r}")


# --- what the decision reads --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What the recovery decision needs from a tool call's ledger row.

    ``attempt`` counts claimed starts (0: never claimed). ``first_started_at`` is when the first
    attempt started and never moves on a retry; the idempotent dedup window is measured from it.
    ``lease_expires_at`` is when the claiming worker's lease runs out. ``dedup_window_ms`` is set
    for idempotent tools and ``finality`` for reconcilable ones, as pinned when the call was
    recorded. All datetimes must be timezone-aware (compare them with an aware ``now``).
    """

    effect_key: str
    effect: Effect
    status: CallStatus
    attempt: int
    first_started_at: datetime | None
    lease_expires_at: datetime | None
    dedup_window_ms: int | None = None
    finality: Finality | None = None

    def __post_init__(self) -> None:
        # A malformed row fails loudly where it is read, not as a wrong decision later.
        if self.effect not in EFFECTS:
            raise ValueError(f"call {self.effect_key}: unknown effect {self.effect!r}")
        if self.status not in CALL_STATUSES:
            raise ValueError(f"call {self.effect_key}: unknown status {self.status!r}")
        if self.finality is not None and self.finality not in FINALITIES:
            raise ValueError(f"call {self.effect_key}: unknown finality {self.finality!r}")
        if self.attempt < 0:
            raise ValueError(f"call {self.effect_key}: attempt must not be negative, got {self.attempt}")
        if self.dedup_window_ms is not None and self.dedup_window_ms < 0:
            raise ValueError(
                f"call {self.effect_key}: dedup_window_ms must not be negative, got {self.dedup_window_ms}"
            )

    @property
    def may_have_started(self) -> bool:
        """Whether anything shows that the call may have started (and its effect happened).

        Any one sign counts, so a half-written row errs on the side of "it may have happened".
        """
        return self.status != "pending" or self.attempt > 0 or self.first_started_at is not None


# --- the decisions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunAgain:
    """Run the call (again, or for the first time) with the same effect key."""

    reason: str


@dataclass(frozen=True, slots=True)
class RecordFound:
    """Record ``value`` as the call's result without running the tool: the lookup found it."""

    value: Any


@dataclass(frozen=True, slots=True)
class Park:
    """Park the call (and its run) for a person to settle; ``reason`` says why, in a sentence."""

    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Do nothing now: a live worker still holds the call's lease until ``until``."""

    until: datetime


@dataclass(frozen=True, slots=True)
class AlreadySettled:
    """Do nothing: the call's result (or error) is already recorded."""


@dataclass(frozen=True, slots=True)
class NeedsLookup:
    """Ask the tool's reconcile lookup (see :func:`~threads_celery.runtime.reconcile_lookup.run_lookup`),
    then decide again with its answer."""


RecoveryDecision: TypeAlias = RunAgain | RecordFound | Park | Wait | AlreadySettled | NeedsLookup
"""Every answer :func:`decide_recovery` can give."""


def decide_recovery(
    call: CallRecord,
    *,
    now: datetime,
    lookup: LookupAnswer | LookupFailed | None = None,
) -> RecoveryDecision:
    """Decide what to do with a tool call that may have been interrupted.

    Pure: no I/O and no clock reads; ``now`` is the caller's clock. The rules, in order:

    1. A completed or errored call is :class:`AlreadySettled`.
    2. A parked call stays parked (:class:`Park`): only a person moves it on.
    3. A call whose lease has not expired (``now < lease_expires_at``) is owned by a live
       worker: :class:`Wait`, whatever its effect. A lease expires at its expiry instant.
    4. A call with no sign of a start (see :attr:`CallRecord.may_have_started`) runs:
       :class:`RunAgain`.
    5. Otherwise the effect decides: read_only runs again; idempotent runs again while
       ``now - first_started_at < dedup_window_ms`` (strictly inside; at the boundary it parks);
       reconcilable returns :class:`NeedsLookup` until ``lookup`` carries the lookup's answer,
       then records a found value, runs again on a final not-found and parks otherwise;
       unguarded parks.

    ``lookup`` is only read for reconcilable calls that reach rule 5.
    """
    if call.status in _SETTLED_STATUSES:
        return AlreadySettled()
    if call.status == "parked":
        return Park(f"{call.effect} call is already parked: {_PERSON_DECIDES}")
    if call.lease_expires_at is not None and now < call.lease_expires_at:
        return Wait(until=call.lease_expires_at)
    if not call.may_have_started:
        return RunAgain("call never started, so running it cannot repeat an effect")

    match call.effect:
        case "read_only":
            return RunAgain("read_only tool interrupted mid-call: it changes nothing, so it is safe to run again")
        case "idempotent":
            return _decide_idempotent(call, now=now)
        case "reconcilable":
            return _decide_reconcilable(call, lookup=lookup)
        case "unguarded":
            return Park(f"unguarded tool interrupted mid-call: {_PERSON_DECIDES}")
        case _:
            assert_never(call.effect)


def _decide_idempotent(call: CallRecord, *, now: datetime) -> RecoveryDecision:
    if call.dedup_window_ms is None:
        return Park(
            f"idempotent call has no dedup window recorded, so a resend may not be deduplicated: {_PERSON_DECIDES}"
        )
    if call.first_started_at is None:
        return Park(
            f"idempotent call has no first start time recorded, so its dedup window of "
            f"{call.dedup_window_ms} ms cannot be checked: {_PERSON_DECIDES}"
        )
    window = timedelta(milliseconds=call.dedup_window_ms)
    if now - call.first_started_at < window:
        return RunAgain(
            f"idempotent call is inside its dedup window of {call.dedup_window_ms} ms since its first "
            f"start at {call.first_started_at.isoformat()}: the provider drops a duplicate with the same key"
        )
    return Park(
        f"idempotent call's dedup window of {call.dedup_window_ms} ms has passed since its first start "
        f"at {call.first_started_at.isoformat()}, so the provider may no longer drop a duplicate: "
        f"{_PERSON_DECIDES}"
    )


def _decide_reconcilable(call: CallRecord, *, lookup: LookupAnswer | LookupFailed | None) -> RecoveryDecision:
    match lookup:
        case None:
            return NeedsLookup()
        case Found(value=value):
            return RecordFound(value)
        case NotFound():
            match call.finality:
                case "final":
                    return RunAgain(
                        "reconcilable call's lookup found no call with its key, and finality is final: "
                        "it never happened"
                    )
                case "nonfinal":
                    return Park(
                        f"reconcilable call's lookup found no call with its key, but finality is nonfinal, "
                        f"so it may not be known yet: {_PERSON_DECIDES}"
                    )
                case None:
                    return Park(
                        f"reconcilable call's lookup found no call with its key, but no finality is recorded "
                        f"to say whether that proves it never happened: {_PERSON_DECIDES}"
                    )
                case _:
                    assert_never(call.finality)
        case LookupUnknown(reason=reason):
            return Park(f"reconcilable call's lookup could not tell whether it happened ({reason}): {_PERSON_DECIDES}")
        case LookupFailed(reason=reason):
            return Park(f"reconcilable call's lookup failed ({reason}): {_PERSON_DECIDES}")
        case _:
            assert_never(lookup)
