"""``threads.retention_sweep``: one bounded batch of the retention sweep, on the control queue.

Beat publishes the first batch every ``THREADS_RETENTION_INTERVAL_S`` when ``THREADS_RETENTION``
sets a policy; a batch that was full publishes the next one with its cursor, as ordinary work
priority on Redis, so the sweep's batches queue behind the work already waiting instead of
holding a worker process from one batch to the next. Once the threads are done, a policy with
``events_keep_days`` goes on with batches of old events (``phase="events"``). Each batch is one read and one short
transaction (:func:`threads_celery.transitions.retention.sweep_batch`). Two sweeps at once (two
Beats, a sweep longer than the interval) are safe: the delete locks its trees, skipping any
that another holds, and decides again under the lock.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery, Task

from threads_celery.decisions.backbone import RETENTION_TASK, WORK_PRIORITY, message_priority
from threads_celery.decisions.retention import Prune
from threads_celery.exceptions import StoreUnavailable
from threads_celery.transitions.retention import sweep_batch, trim_events_batch

if TYPE_CHECKING:
    from threads_celery.worker.application import RuntimeHolder

log = logging.getLogger("threads_celery.worker.retention")


def install_retention_task(app: Celery, holder: RuntimeHolder) -> None:
    """Register ``threads.retention_sweep`` on ``app``, running on ``holder``'s runtime."""

    # Acknowledged on receipt, like a tick: a batch lost with its worker is swept by the next sweep.
    @app.task(
        name=RETENTION_TASK, bind=True, shared=False, send_events=holder.settings.control_task_events, acks_late=False
    )  # fmt: skip
    def retention_sweep(
        self: Task[Any, Any],
        after_created_at: str | None = None,
        after_id: str | None = None,
        dry_run: bool | None = None,
        phase: str = "threads",
    ) -> str:
        """Prune (or, in a dry run, list) one batch of expired threads, or of old events once the
        threads are done (``phase="events"``); publish the next batch."""
        policy = holder.settings.retention

        def publish_next(**kwargs: Any) -> None:
            options: dict[str, Any] = {"countdown": policy.pause_s} if policy.pause_s else {}
            if message_priority("threads.step", recovered=False, broker_url=str(app.conf.broker_url or "")) is not None:
                options["priority"] = WORK_PRIORITY
            self.apply_async(kwargs={"dry_run": dry_run, **kwargs}, **options)

        if phase == "events":
            try:
                runtime = holder.get()
                trimmed = trim_events_batch(runtime.store, policy, now=runtime.clock(), dry_run=dry_run)
            except StoreUnavailable as exc:
                log.warning("%s: the store is unavailable; the next sweep starts again: %s", self.name, exc)
                return "store unavailable"
            summary = f"events: deleted {trimmed.deleted} through id {trimmed.through_id}" + (
                " (dry run)" if trimmed.dry_run else ""
            )
            log.info("retention sweep batch: %s", summary)
            if trimmed.more:
                publish_next(phase="events")
            return summary
        after = (datetime.fromisoformat(after_created_at), after_id) if after_created_at and after_id else None
        try:
            runtime = holder.get()
            batch = sweep_batch(
                runtime.store, policy, now=runtime.clock(), after=after, dry_run=dry_run,
                storage_options=policy.archive_options, files_root=holder.settings.files_root,
            )  # fmt: skip
        except StoreUnavailable as exc:
            log.warning("%s: the store is unavailable; the next sweep starts again: %s", self.name, exc)
            return "store unavailable"
        due = [d for d in batch.decisions if isinstance(d, Prune)]
        if batch.dry_run:
            for decision in due:
                log.info(
                    "retention (dry run): would %s thread %s (%s)", decision.action, decision.thread_id, decision.rule
                )
        summary = f"examined {len(batch.decisions)}, due {len(due)}, pruned {len(batch.pruned)}" + (
            " (dry run)" if batch.dry_run else ""
        )
        log.info("retention sweep batch: %s", summary)
        if batch.next_after is not None:
            created_at, thread_id = batch.next_after
            publish_next(after_created_at=created_at.isoformat(), after_id=thread_id)
        elif policy.events_keep is not None:
            publish_next(phase="events")
        return summary
