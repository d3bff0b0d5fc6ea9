"""The Celery tasks: ``threads.step``, ``threads.tool``, ``threads.deliver``, ``threads.reconcile``
and ``threads.scheduled_run``.

Each body is thin: it loads this process's runtime and hands the message's ids to it; the runtime
reads the ledger, decides and commits. What the broker carries is an id only (see
:mod:`threads_celery.transitions.publishing`), so a duplicate or late delivery finds the ledger
already moved on and does nothing. :func:`_run` maps what the runtime raises onto Celery: retry
later, a lost fence (another worker owns the run now), an unreachable store, and a poison message
(a step or tool that keeps failing unforeseen: bounded tries, then the run ends).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery, Task

from threads_celery.decisions.backbone import (
    DELIVER_TASK,
    RECONCILE_TASK,
    SCHEDULED_RUN_TASK,
    tick_is_covered,
)
from threads_celery.decisions.retry import STORE_UNAVAILABLE_BACKOFF, GiveUp
from threads_celery.exceptions import FenceLost, RetryLater, StoreUnavailable
from threads_celery.redaction import known_secrets
from threads_celery.runtime import deploys
from threads_celery.runtime.failures import apply_task_failure
from threads_celery.runtime.schedules import start_scheduled_run
from threads_celery.runtime.tool_faults import describe, is_control, picklable, survives_pickling
from threads_celery.telemetry.metrics import timed_tick
from threads_celery.transitions.publishing import deploy_version_of
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK
from threads_celery.transitions.upgrades import UPGRADE_TASK
from threads_celery.worker.lost_workers import LossCounter, counting_request
from threads_celery.worker.task_states import stated_request

if TYPE_CHECKING:
    from threads_celery.worker.application import RuntimeHolder

log = logging.getLogger("threads_celery.worker.tasks")


#: Message headers that count a task's failed tries across its Celery retries. ``retries``
#: counts every retry, waits included (a run held by another worker, a provider's advised delay,
#: the store away), so it cannot bound failures: these go up only when a try failed, and travel
#: with the retried message (Celery keeps a request's custom headers on a retry).
STEP_FAILURES_HEADER = "threads_step_failures"
TASK_FAILURES_HEADER = "threads_task_failures"


def failed_tries(task: Task[Any, Any], header: str) -> int:
    """How many tries of this task failed before this one, as ``header`` counts them."""
    value = (task.request.headers or {}).get(header, 0)
    return value if isinstance(value, int) and value >= 0 else 0


def _retry(task: Task[Any, Any], countdown: float, failed: str | None = None) -> BaseException:
    """Celery's retry of ``task`` after ``countdown``; ``failed`` names the count this try adds to."""
    if failed is None:
        return task.retry(countdown=countdown, exc=None)
    headers = {**(task.request.headers or {}), failed: failed_tries(task, failed) + 1}
    return task.retry(countdown=countdown, exc=None, headers=headers)


def _run(
    task: Task[Any, Any],
    holder: RuntimeHolder,
    work: Callable[[], str],
    poison_key: str | None = None,
    *,
    retry_unavailable: bool = True,
) -> str:
    """Run ``work`` (one task's body) and turn what it raises into Celery's answer.

    ``retry_unavailable`` false lets StoreUnavailable through instead of retrying the task.
    """
    try:
        return work()
    except RetryLater as exc:
        raise _retry(task, exc.countdown, STEP_FAILURES_HEADER if exc.failed else None) from None
    except FenceLost as exc:
        log.info("%s: %s", task.name, exc)
        return "fence lost"
    except StoreUnavailable as exc:
        if not retry_unavailable:
            raise
        countdown = STORE_UNAVAILABLE_BACKOFF.delay_s((task.request.retries or 0) + 1)
        log.warning("%s: store unavailable, retrying in %gs: %s", task.name, countdown, exc)
        raise _retry(task, countdown) from None
    except BaseException as exc:
        if is_control(exc):
            raise
        if poison_key is None:
            if survives_pickling(exc):
                raise
            raise picklable(exc) from None
        # A step or tool task that fails unforeseen: bounded tries, then the run ends. Whatever
        # still escapes goes to billiard as a plain picklable exception (one that cannot be
        # unpickled in the prefork main process kills it).
        failures = failed_tries(task, TASK_FAILURES_HEADER) + 1
        try:
            decision = apply_task_failure(holder.get(), task.name, poison_key, failures, exc)
        except StoreUnavailable as unreachable:
            # Neither the failure nor the run's end can be recorded now: try the task again
            # once the store is back, as for any task that finds it away (failing the task here
            # would leave its run to the lease's expiry, and a call that ran to a rerun).
            countdown = STORE_UNAVAILABLE_BACKOFF.delay_s(failures)
            log.warning(
                "%s: failed (%s), and the store is unavailable to record it; retrying in %gs: %s",
                task.name, describe(exc, known_secrets()), countdown, unreachable,
            )  # fmt: skip
            raise _retry(task, countdown, TASK_FAILURES_HEADER) from None
        if isinstance(decision, GiveUp):
            return f"gave up: {decision.reason}"
        raise _retry(task, decision.countdown, TASK_FAILURES_HEADER) from None


def install_tasks(app: Celery, holder: RuntimeHolder) -> None:
    """Register the five tasks on ``app``, each running on ``holder``'s runtime."""
    # Control tasks go ahead of all work on Redis by their route's priority (celery_config), and
    # send no task events unless THREADS_CONTROL_TASK_EVENTS: monitors list the agents' work.
    control_events = holder.settings.control_task_events
    # A step's or call's pool process that is lost is counted (see lost_workers); one killed at
    # the hard time limit goes back to the broker as after any other loss, instead of waiting
    # for the backbone (acks_on_failure_or_timeout=False; a task that fails is dropped either way).
    # A step or call that ended without doing its work (awaiting approval, parked, voided...) is
    # listed by monitors as what it is, not as SUCCESS (see task_states).
    counting = stated_request(counting_request(LossCounter(holder)))

    # Every task but the tick is acknowledged after it ran and given back to the broker when its
    # worker dies. ``shared=False`` keeps each task on this app only: a process may hold several
    # apps (two embedded runtimes, a test's). The bound tasks' ``self`` is the Task the decorator
    # builds; its call signature is Any there. ``max_retries=None``: Celery's own bound (3
    # retries) would fail a task that waits a fourth time; the runtime bounds failures itself
    # (model_retries, max_task_failures, the provider's time budget). The tick keeps Celery's
    # bound: Beat sends another.
    @app.task(
        name=STEP_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, max_retries=None,
        Request=counting, acks_on_failure_or_timeout=False,
    )  # fmt: skip
    def step(self: Task[Any, Any], run_id: str, n: int) -> str:
        """Run one model step of a run."""
        runtime = holder.get()
        attempt = failed_tries(self, STEP_FAILURES_HEADER)
        return _run(self, holder, lambda: runtime.run_step(run_id, n, attempt=attempt), run_id)

    @app.task(
        name=TOOL_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, max_retries=None,
        Request=counting, acks_on_failure_or_timeout=False,
    )  # fmt: skip
    def tool(self: Task[Any, Any], effect_key: str) -> str:
        """Run one tool call, by effect key."""
        runtime = holder.get()
        return _run(self, holder, lambda: runtime.run_tool(effect_key), effect_key)

    if deploy_version_of(app) is not None:  # only versioned workers take upgrades (threads@V)
        _install_upgrade(app, holder)

    @app.task(
        name=DELIVER_TASK,
        bind=True,
        shared=False,
        send_events=control_events,
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=None,
    )
    def deliver(self: Task[Any, Any], run_id: str, status: str) -> str:
        """Deliver an agent-tool run's finish: the parent's tool result, on_finish or notify."""
        runtime = holder.get()
        return _run(self, holder, lambda: runtime.deliver(run_id, status))

    # Acknowledged on receipt: a tick lost with its worker is replaced by Beat's next one.
    @app.task(name=RECONCILE_TASK, bind=True, shared=False, send_events=control_events, acks_late=False)
    def reconcile(self: Task[Any, Any], published_at: float | None = None) -> str:
        """Beat's backbone tick: re-dispatch runs whose worker died, republish lost outbox rows.

        ``published_at`` (Beat's clock) lets a tick that waited in the queue see that a later
        tick already swept everything it would; it is then skipped, never discarded unseen.
        """
        if tick_is_covered(published_at, holder.last_tick_started_at):
            return "covered by a later tick"
        try:
            runtime = holder.get()
            holder.last_tick_started_at = time.time()
            with timed_tick():
                return _run(self, holder, lambda: str(runtime.reconcile_tick()), retry_unavailable=False)
        except StoreUnavailable as exc:
            # Not retried: Beat's next tick sweeps everything this one would have.
            log.warning("%s: the store is unavailable; the next tick sweeps: %s", self.name, exc)
            return "store unavailable"

    @app.task(
        name=SCHEDULED_RUN_TASK,
        bind=True,
        shared=False,
        send_events=control_events,
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=None,
    )
    def scheduled_run(self: Task[Any, Any], schedule_name: str, slot_iso: str | None = None) -> str:
        """Start the run of one slot of a schedule (Beat publishes it); idempotent by slot."""
        runtime = holder.get()
        return _run(self, holder, lambda: start_scheduled_run(runtime, holder.schedules, schedule_name, slot_iso))


def _install_upgrade(app: Celery, holder: RuntimeHolder) -> None:
    """Register ``threads.upgrade`` (see :mod:`threads_celery.runtime.deploys`) on a versioned app."""

    @app.task(
        name=UPGRADE_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, max_retries=None,
    )  # fmt: skip
    def upgrade(self: Task[Any, Any], run_id: str, version: str) -> str:
        """Check an upgrading run against this worker's agents and move it here, or pin it with
        the reason. Sent to the target version's queue; any other worker leaves it."""
        runtime = holder.get()
        if runtime.deploy_version != version:
            return f"skipped: this worker is version {runtime.deploy_version}, not {version}"
        report = _run(self, holder, lambda: str(deploys.upgrade_run(runtime, run_id, version).as_dict()))
        return report
