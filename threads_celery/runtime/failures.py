"""A step or tool task that keeps failing (a poison message) ends its run instead of looping.

``threads.step`` and ``threads.tool`` turn what they can foresee into results: a provider error
is retried and then ends the run, a tool's exception is a tool result, arguments that do not
parse are a tool error the model can fix. Anything else that escapes a task (a bug, a value the
database refuses) would otherwise repeat for ever: the run's lease expires, the backbone sends
the task again, and the model is asked again. Here such a failure is retried with backoff a
bounded number of times (``Settings.max_task_failures``, ``THREADS_MAX_TASK_FAILURES``), then
the run ends ``error`` with the reason, as Celery users expect of a poison message.

The decision is :func:`threads_celery.decisions.retry.decide_task_failure`, a pure function of the
one retry policy; :func:`apply_task_failure` is the thin shell around it.
"""

from __future__ import annotations

import logging

from threads_celery.decisions.retry import GiveUp, RetryDecision, decide_task_failure
from threads_celery.exceptions import FenceLost
from threads_celery.records import UNSETTLED_STATUSES, CallRow, Run
from threads_celery.redaction import known_secrets
from threads_celery.runtime.ports import Worker
from threads_celery.runtime.tool_faults import describe
from threads_celery.transitions import runs

log = logging.getLogger("threads_celery.runtime.failures")


def apply_task_failure(
    worker: Worker, task: str, key: str, failures: int, exc: BaseException
) -> RetryDecision | GiveUp:
    """Record the failure of a step (``key`` = run id) or tool task (``key`` = effect key).

    Trying again: the run's lease is given back (when this worker holds it) so the next try
    claims at once instead of waiting out the lease. Giving up: the run ends ``error`` with the
    reason, and a tool call is settled as an error, so nothing sends the task again.
    """
    decision = decide_task_failure(
        task, key, failures, worker.settings.max_task_failures, describe(exc, known_secrets())
    )
    if _apply(worker, task, key, decision) and isinstance(decision, RetryDecision):
        log.warning(
            "%s %s failed (%d of %d), trying again in %.0f s: %s",
            task,
            key,
            failures,
            worker.settings.max_task_failures,
            decision.countdown,
            describe(exc, known_secrets()),
        )
    return decision


def ended_lost_call(worker: Worker, call: CallRow) -> str | None:
    """End the call's run when the worker processes running the call were lost
    ``max_task_failures`` times (see :mod:`threads_celery.worker.lost_workers`); what happened,
    or None when the call is to run (or be recovered by its effect) as usual."""
    if call.status not in UNSETTLED_STATUSES or call.lost_times < worker.settings.max_task_failures:
        return None
    return _end_lost(worker, runs.TOOL_TASK, call.effect_key, f"call {call.effect_key} ({call.tool})", call.lost_times)


def ended_lost_step(worker: Worker, run: Run, step: int) -> str | None:
    """:func:`ended_lost_call` for a model step of ``run``."""
    if run.lost_step != step or run.lost_times < worker.settings.max_task_failures:
        return None
    return _end_lost(worker, runs.STEP_TASK, run.id, f"model step {step}", run.lost_times)


def _end_lost(worker: Worker, task: str, key: str, what: str, times: int) -> str:
    reason = (
        f"{what}: the worker process running it was lost {times} times (killed, out of memory, or"
        f" past the hard time limit, THREADS_TASK_TIME_LIMIT_S), so it is not run again"
    )
    _apply(worker, task, key, GiveUp(reason))
    return f"gave up: {reason}"


def _apply(worker: Worker, task: str, key: str, decision: RetryDecision | GiveUp) -> bool:
    """Apply ``decision`` to the run of the step (``key`` = run id) or call (effect key); whether
    it applied (not when the run has ended or moved on meanwhile)."""
    now = worker.clock()
    entries = []
    run_id = key
    try:
        with worker.store.transaction() as tx:
            if task == runs.TOOL_TASK:
                loaded = tx.get_call_and_run(key)
                if loaded is None:
                    return False
                run_id = loaded[1].id
            # Not locked here: finish() locks the thread before the run, and so must everyone.
            run = tx.get_run(run_id)
            if run is None or run.is_terminal:
                return False
            if isinstance(decision, RetryDecision):
                if task == runs.TOOL_TASK:
                    # A read_only call's row would be republished alongside our own retries.
                    tx.touch_outbox(key, now)
                if run.lease_owner == worker.worker_id:
                    tx.advance_run(run.id, fence=run.fence, now=now, lease_owner=None, lease_expires_at=None)
            else:
                if task == runs.TOOL_TASK:
                    tx.settle_call(key, status="error", result=decision.reason, is_error=True, now=now)
                    tx.delete_outbox(key)
                entries = runs.finish(tx, run, fence=run.fence, status="error", now=now, error=decision.reason)
    except FenceLost:
        # The run moved on meanwhile, so it is not wedged: the call's settling is rolled back
        # with the rest, and its outbox row stays for whoever holds the run now.
        log.info("%s %s gave up, but run %s has moved on: left to it", task, key, run_id)
        return False
    worker.publish(entries)
    if isinstance(decision, GiveUp):
        log.error("run %s ended: %s", run_id, decision.reason)
    return True
