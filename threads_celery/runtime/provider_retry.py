"""The step machine's shell around provider failures and rate-limit windows (decisions in
:mod:`threads_celery.decisions.provider_limits` and :mod:`threads_celery.decisions.retry`): load,
decide, apply."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from threads_celery.decisions.provider_limits import classify_provider_failure
from threads_celery.decisions.retry import GiveUp, decide_model_step_retry, decide_provider_retry
from threads_celery.exceptions import FenceLost, RetryLater
from threads_celery.redaction import describe_exception
from threads_celery.runtime.outcomes import finish_run
from threads_celery.runtime.ports import Ledger, Worker
from threads_celery.runtime.rate_limiter import RateLimiter

if TYPE_CHECKING:
    from threads_celery.records import Run

log = logging.getLogger("threads_celery.runtime.machine")
RETRY_EVENT = "model_retry"


class Throttled(Ledger, Protocol):
    """A ledger, and the provider's request windows this worker shares (see :mod:`.rate_limiter`)."""

    @property
    def rate_limiter(self) -> RateLimiter: ...


def _released(run: Run, step: int | None) -> dict[str, object]:
    """The columns that give a run's lease back; with ``step``, after an attempt of that model
    step the provider answered (so billed) and the run throws away: its usage counts it."""
    values: dict[str, object] = {"lease_owner": None, "lease_expires_at": None}
    if step is not None:
        values.update(voided_step=step, voided_requests=run.voided_after_claim(step) + 1)
    return values


def release_and_retry(
    ledger: Ledger,
    run: Run,
    fence: int,
    seconds: float,
    reason: str,
    *,
    event: dict[str, object] | None = None,
    billed_step: int | None = None,
) -> None:
    """Give the run's lease back (so the retry, on any worker, claims at once), note the wait in
    the thread's log, and raise RetryLater: a Celery retry with a countdown holds no worker slot.
    ``run`` is the run as its claim found it; ``billed_step``: see :func:`_released`."""
    with ledger.store.transaction() as tx:
        if tx.advance_run(run.id, fence=fence, now=ledger.clock(), **_released(run, billed_step)) is None:
            raise FenceLost(run.id, fence)
        if event is not None:
            tx.append_event(run.thread_id, run.id, RETRY_EVENT, event, ledger.clock())
    raise RetryLater(seconds, reason)


def wait_for_window(throttled: Throttled, run: Run, fence: int, provider: str) -> None:
    """Take a request from the provider's shared window, or retry the step when the window opens."""
    wait = throttled.rate_limiter.acquire(provider, throttled.clock())
    if wait is not None:
        log.info(
            "run %s: %s rate limit reached, waiting %.1fs for the next window",
            run.id,
            provider,
            wait,
        )
        release_and_retry(throttled, run, fence, wait, f"{provider} rate limit: waiting for the next window")


def provider_failed(worker: Worker, run: Run, fence: int, step: int, exc: Exception, *, billed: bool) -> str | None:
    """Wait out a transient provider failure (429, 5xx, timeout) for at most the configured time.

    ``billed``: the provider had begun to answer (a reply cut off mid-stream): the attempt's
    request counts in the step's usage. Returns None when the failure is not transient (the attempt-based :func:`step_failed` applies);
    raises RetryLater to try again; returns what happened when the run ended ``error``.
    """
    now: datetime = worker.clock()
    failure = classify_provider_failure(exc, now)
    if not failure.transient:
        return None
    reason = describe_exception(exc, ())
    with worker.store.read() as tx:
        last = tx.last_event_of(run.thread_id, run.id, RETRY_EVENT)
    same_step = last is not None and last.get("step") == step
    first_failed_at = datetime.fromisoformat(str(last["first_failed_at"])) if same_step and last else now
    failures = int(last.get("failures", 0)) + 1 if same_step and last else 1
    decision = decide_provider_retry(
        failure,
        failures_so_far=failures,
        first_failed_at=first_failed_at,
        now=now,
        retry_for_s=worker.settings.provider_retry_for_s,
        reason=reason,
    )
    if isinstance(decision, GiveUp):
        finish_run(worker, run, fence, "error", error=f"model step {step} failed: {decision.reason}")
        return f"error: {decision.reason}"
    log.warning(
        "run %s step %d: provider failed (%s), retrying in %.1fs: %s",
        run.id,
        step,
        failure.status,
        decision.countdown,
        reason,
    )
    release_and_retry(
        worker, run, fence, decision.countdown, reason,
        event={
            "run_id": run.id, "step": step, "status": failure.status, "retry_in_s": round(decision.countdown, 3),
            "failures": failures, "first_failed_at": first_failed_at.isoformat(), "reason": reason,
        },
        billed_step=step if billed else None,
    )  # fmt: skip
    return None  # pragma: no cover - release_and_retry raised


def step_failed(
    worker: Worker, run: Run, fence: int, step: int, attempt: int, exc: Exception, *, billed: bool = False
) -> str:
    """A model step failed (no transient HTTP answer, or its reply could not be stored): retry it
    with backoff while it has retries (raising RetryLater), else end the run ``error``.
    ``billed``: the provider had answered the attempt, so its request counts in the step's usage."""
    reason = describe_exception(exc, ())
    decision = decide_model_step_retry(
        attempt=attempt,
        retries=worker.settings.model_retries,
        status=getattr(exc, "status_code", None),
        step=step,
        reason=reason,
    )
    if isinstance(decision, GiveUp):
        finish_run(worker, run, fence, "error", error=decision.reason)
        return f"error: {reason}"
    # Give the lease back so the retry (on any worker) can claim at once.
    with worker.store.transaction() as tx:
        if tx.advance_run(run.id, fence=fence, now=worker.clock(), **_released(run, step if billed else None)) is None:
            raise FenceLost(run.id, fence)
    log.warning("run %s step %d failed (attempt %d), retrying: %s", run.id, step, attempt + 1, reason)
    raise RetryLater(decision.countdown, reason, failed=True)
