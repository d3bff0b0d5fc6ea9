"""The retry policy, written once: how long to wait before trying again, and when to stop.

Every retry the runtime makes is decided here, as a value in the style of procrastinate's
``RetryDecision``: :class:`RetryDecision` (try again after a countdown in seconds) or :class:`GiveUp`
(stop, with the reason the run ends with). The shells around the decisions apply them: a
Celery retry with a countdown, a delivery claim that lapses later, a short sleep.

=============================  =====================  ====================================
what failed                    waits (s), by failure   gives up
=============================  =====================  ====================================
a step or tool task (poison)   1, 2, 4, ... <= 30      after ``max_task_failures`` in a row
a model step (no HTTP status,  1, 2, 4, ... <= 30      after ``model_retries`` retries, or
or a refused request)                                  at once when the provider refused
                                                       the request itself (a 4xx)
a transient provider answer    ``Retry-After``, else   ``provider_retry_for_s`` after the
(429, 408/409/425, 5xx)        1, 2, 4, ... <= 60      step's first such failure
an agent-tool finish delivery  5, 15, 30, 120, 120...  never (its hooks must be fixed)
a task while the store is      1, 2, 4, ... <= 30      never (nothing was written)
unreachable
a result commit while the      0.1, 0.2, ... <= 2      by the caller's deadline
store is unreachable
=============================  =====================  ====================================

The outbox's republish pacing is a backoff too, counted in graces rather than seconds
(:data:`REPUBLISH_BACKOFF`: 2, 4, 8, then 16 graces): a row nobody consumed within its grace is
published again, and behind a backlog its message is mostly only waiting, so each republish
waits longer before the next.

No clock reads and no I/O: the caller passes the failure count and, for time-bounded policies,
how long it has been failing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from threads_celery.decisions.provider_limits import RETRY_FOR_VARIABLE, TRANSIENT_STATUSES, ProviderFailure
from threads_celery.records import Message

__all__ = [
    "DELIVERY_BACKOFF",
    "MODEL_STEP_BACKOFF",
    "PROVIDER_BACKOFF",
    "REPUBLISH_BACKOFF",
    "STORE_RECONNECT_BACKOFF",
    "STORE_UNAVAILABLE_BACKOFF",
    "TASK_FAILURE_BACKOFF",
    "Backoff",
    "GiveUp",
    "RetryDecision",
    "Schedule",
    "decide_model_step_retry",
    "decide_provider_retry",
    "decide_task_failure",
    "is_refused_request",
]


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Try again after ``countdown`` seconds (named as Celery's ``task.retry(countdown=...)``)."""

    countdown: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop trying: ``reason`` says what failed, how often or for how long, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``first_s`` after the first failure, doubled for each one after it,
    never more than ``cap_s``."""

    first_s: float
    cap_s: float

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (this one included; 0 counts as 1)."""
        return min(self.first_s * 2.0 ** max(failures - 1, 0), self.cap_s)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Waits written out, by failure; the last one repeats."""

    delays_s: tuple[float, ...]

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (this one included; 0 counts as 1)."""
        return self.delays_s[min(max(failures - 1, 0), len(self.delays_s) - 1)]


TASK_FAILURE_BACKOFF: Final = Backoff(first_s=1.0, cap_s=30.0)
"""Between two tries of a step or tool task that raised what it could not turn into a result."""

MODEL_STEP_BACKOFF: Final = Backoff(first_s=1.0, cap_s=30.0)
"""Between two tries of a model step whose request failed without a transient HTTP answer."""

PROVIDER_BACKOFF: Final = Backoff(first_s=1.0, cap_s=60.0)
"""Between two tries of a model step the provider answered 429/5xx without a ``Retry-After``."""

DELIVERY_BACKOFF: Final = Schedule((5.0, 15.0, 30.0, 120.0))
"""Before an agent-tool finish whose delivery (its hooks) failed is delivered again."""

STORE_UNAVAILABLE_BACKOFF: Final = Backoff(first_s=1.0, cap_s=30.0)
"""Between two deliveries of a task that found the store unreachable (a Celery retry: the task
holds no worker slot while it waits, and nothing was written, so it is retried without bound)."""

STORE_RECONNECT_BACKOFF: Final = Backoff(first_s=0.1, cap_s=2.0)
"""Between two tries of committing an executed call's result while the store is unreachable."""

REPUBLISH_BACKOFF: Final = Backoff(first_s=2.0, cap_s=16.0)
"""In graces, not seconds: how long after a republish an unconsumed outbox row is due again
(:func:`threads_celery.decisions.backbone.republish_delay`)."""


def decide_task_failure(task: str, key: str, failures: int, limit: int, error: str) -> RetryDecision | GiveUp:
    """What to do after the ``failures``-th failure in a row (this one included) of a task."""
    if failures >= limit:
        return GiveUp(f"{task} {key} failed {failures} times in a row; the last error: {error}")
    return RetryDecision(TASK_FAILURE_BACKOFF.delay_s(failures))


def is_refused_request(status: object) -> bool:
    """Whether an HTTP status says the provider refused the request as such (a bad model name,
    key or request): it fails the same way every time, so trying again is pointless. Timeouts,
    rate limits, conflicts and server errors are worth another try."""
    return isinstance(status, int) and 400 <= status < 500 and status not in TRANSIENT_STATUSES


def decide_model_step_retry(
    *, attempt: int, retries: int, status: object, step: int, reason: str
) -> RetryDecision | GiveUp:
    """Whether a failed model step is tried again: ``attempt`` counts the tries made before this
    one (0 for the first), ``retries`` is how many retries a step gets (``model_retries``), and
    ``status`` is the failure's HTTP status, if it has one."""
    if attempt < retries and not is_refused_request(status):
        return RetryDecision(MODEL_STEP_BACKOFF.delay_s(attempt + 1))
    tries = attempt + 1
    return GiveUp(f"model step {step} failed after {tries} {'attempt' if tries == 1 else 'attempts'}: {reason}")


def decide_provider_retry(
    failure: ProviderFailure,
    *,
    failures_so_far: int,
    first_failed_at: datetime,
    now: datetime,
    retry_for_s: float,
    reason: str,
) -> RetryDecision | GiveUp:
    """Retry a transient failure after the advised delay (else capped backoff) while the step has
    failed for less than ``retry_for_s``; never schedule a retry past that bound."""
    elapsed = (now - first_failed_at).total_seconds()
    remaining = retry_for_s - elapsed
    if remaining <= 0:
        return GiveUp(
            f"the model provider kept failing for {elapsed:.0f}s (limit {retry_for_s:g}s, "
            f"{RETRY_FOR_VARIABLE}); last: {reason}"
        )
    delay = failure.retry_after_s if failure.retry_after_s is not None else PROVIDER_BACKOFF.delay_s(failures_so_far)
    return RetryDecision(min(delay, remaining))


def failed_outputs(messages: Sequence[Message], run_id: str, output_tools: frozenset[str]) -> int:
    """How many outputs of run ``run_id`` failed (a call of an output tool that did not validate,
    or that an output validator answered with ``ModelRetry``), as Pydantic AI counts output
    retries: over the whole run and every output tool. Pure."""
    return sum(
        1
        for m in messages
        if m.run_id == run_id
        and m.tool_result is not None
        and m.tool_result.name in output_tools
        and m.tool_result.kind in ("retry", "invalid")
    )


def retried_in_last_reply(messages: Sequence[Message], run_id: str) -> list[str]:
    """The tools whose calls of run ``run_id``'s last model reply were asked to retry so far
    (a result of kind ``"retry"`` or ``"invalid"``), in order. Pure."""
    retried: list[str] = []
    for message in messages:
        if message.run_id != run_id:
            continue
        if message.role == "assistant":
            retried = []
        elif (
            message.role == "tool"
            and message.tool_result is not None
            and message.tool_result.kind in ("retry", "invalid")
        ):
            retried.append(message.tool_result.name)
    return retried


def model_retries(messages: Sequence[Message], run_id: str, tool: str) -> int:
    """How many model turns in a row of run ``run_id`` the model was asked to retry ``tool``, as
    Pydantic AI counts ``ctx.retry``. Pure.

    A tool result of kind ``"retry"`` (the tool raised ``ModelRetry``) or ``"invalid"`` (its
    arguments did not validate) counts one more at the next model turn; any other result resets
    the count.
    """
    retries: dict[str, int] = {}
    failed: set[str] = set()
    succeeded: set[str] = set()
    for message in messages:
        if message.run_id != run_id:
            continue
        if message.role == "assistant":  # a model turn: the last turn's outcomes carry over
            for name in succeeded - failed:
                retries.pop(name, None)
            for name in failed:
                retries[name] = retries.get(name, 0) + 1
            failed, succeeded = set(), set()
        elif message.role == "tool" and message.tool_result is not None:
            result = message.tool_result
            (failed if result.kind in ("retry", "invalid") else succeeded).add(result.name)
    return retries.get(tool, 0)
