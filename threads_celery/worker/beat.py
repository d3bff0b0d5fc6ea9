"""What Celery Beat publishes: the reconcile backbone and the scheduled batch agents.

:class:`Scheduler` is the ``beat_scheduler`` of every threads app (see
:func:`threads_celery.transitions.publishing.celery_config`), so ``celery -A threads_celery.worker beat``,
``celery -A tasks beat`` and ``threads-celery beat`` use it. Its ``beat_schedule`` holds two kinds of job:

- The reconcile backbone: the ``threads.reconcile`` task every ``THREADS_RECONCILE_INTERVAL_S``
  seconds (default 5). A tick republishes outbox rows nobody consumed, re-dispatches steps and
  calls whose lease expired, and settles interrupted calls by their effect. Ticks are safe to
  overlap and to run from two Beats at once, so a duplicate Beat wastes work but breaks nothing.
- Scheduled batch agents: the ``SCHEDULES`` declared in the modules of ``THREADS_AGENTS``, each
  published as ``threads.scheduled_run(name, slot)`` once per slot. Two Beats publish the same
  slot, and the run id derived from it makes that one run.

On start-up it reads the ``SCHEDULES`` lists of the modules in
``THREADS_AGENTS`` (:class:`threads_celery.runtime.schedules.Schedule` values) and adds one Beat entry
per enabled schedule, ``threads-schedule:<name>``, next to the reconcile backbone. It keeps
Celery's persistent schedule file (``-s PATH``), which is where it remembers when it last
published each schedule.

Beat imports those modules to read them (so it needs the agents' code, as workers do); if that
fails it logs the error and runs the reconcile backbone alone.

When an entry is due it publishes ``threads.scheduled_run(name, slot_iso)`` with Celery task id
``sched:<name>:<slot>``. The slot is the clock floored to the schedule
(:func:`threads_celery.runtime.schedules.beat_slot`), not the moment of publishing, so two Beats agree on
it, and the worker's run id is derived from it: two Beats, or one Beat and a redelivery, start one
run per slot. Entries are due on the schedule's own slots (an interval is aligned to multiples of
itself since 1970-01-01 UTC, not to when Beat started), so Beat's drift cannot skip a slot.
After a gap (more than one slot passed since this Beat last published the schedule),
``missed="skip"`` publishes nothing and ``missed="run_once"`` publishes the latest missed slot.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from celery.beat import PersistentScheduler, ScheduleEntry
from celery.schedules import BaseSchedule, schedstate
from kombu import Producer

from threads_celery.decisions.backbone import RECONCILE_TASK
from threads_celery.runtime.schedules import (
    SCHEDULED_RUN_TASK,
    MissedPolicy,
    Schedule,
    ScheduleRegistry,
    Timing,
    beat_slot,
    format_slot,
)
from threads_celery.settings import Settings

log = logging.getLogger("celery.beat.threads")

ENTRY_PREFIX = "threads-schedule:"

__all__ = ["ENTRY_PREFIX", "Scheduler", "SlotSchedule", "beat_entries", "plain_beat_entries", "schedules_for_app"]


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class SlotSchedule(BaseSchedule):
    """Celery's view of a schedule: due at its next slot after the last publish."""

    def __init__(self, name: str, timing: Timing, missed: MissedPolicy = "skip", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.timing = timing
        self.missed = missed

    def now(self) -> datetime:
        return datetime.now(UTC)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return self.timing.next_after(_utc(last_run_at)) - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        now = self.now()
        due_at = self.timing.next_after(_utc(last_run_at))
        if now >= due_at:
            return schedstate(True, max((self.timing.next_after(now) - now).total_seconds(), 0.0))
        return schedstate(False, (due_at - now).total_seconds())

    def __reduce__(self) -> Any:
        return self.__class__, (self.name, self.timing, self.missed)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SlotSchedule):
            return (self.name, self.timing, self.missed) == (other.name, other.timing, other.missed)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.name, self.timing.interval, self.timing.tz, self.missed))

    def __repr__(self) -> str:
        return f"<slots {self.timing.describe()} missed={self.missed}>"


def beat_entry(schedule: Schedule) -> dict[str, Any]:
    """The Beat entry of one schedule; :class:`Scheduler` adds the slot when it publishes."""
    return {
        "task": SCHEDULED_RUN_TASK,
        "schedule": SlotSchedule(schedule.name, schedule.timing, schedule.missed),
        "args": (schedule.name,),
    }


def beat_entries(schedules: ScheduleRegistry) -> dict[str, dict[str, Any]]:
    """Beat entries for the enabled schedules, named ``threads-schedule:<name>``."""
    return {f"{ENTRY_PREFIX}{s.name}": beat_entry(s) for s in schedules if s.enabled}


def plain_beat_entries(schedules: ScheduleRegistry) -> dict[str, dict[str, Any]]:
    """The enabled schedules as entries any Celery Beat scheduler can keep (an interval or a
    crontab, published without a slot): what a project's own Beat gets (``install(app)``).

    The worker floors the moment it starts the run to the schedule, so each slot is still one
    run (the run id comes from the slot). What only :class:`Scheduler` does: the missed-slot
    policies (a scheduler of Celery's publishes a missed entry once, at its next tick), and a
    crontab's own ``tz`` (another scheduler reads a crontab in the app's ``timezone``).
    """
    return {
        f"{ENTRY_PREFIX}{s.name}": {
            "task": SCHEDULED_RUN_TASK,
            "schedule": s.timing.interval if s.timing.interval is not None else s.timing.cron,
            "args": (s.name,),
        }
        for s in schedules
        if s.enabled
    }


def _fields(entry: ScheduleEntry, **changes: Any) -> dict[str, Any]:
    """The entry's fields with ``changes`` applied: what ``dict(entry, ...)`` gives (an entry
    iterates over ``vars(entry).items()``), spelled so that type checkers can follow it."""
    return {**vars(entry), **changes}


def schedules_for_app(app: Celery) -> ScheduleRegistry:
    """The schedules declared in the agent modules the app's settings name (``THREADS_AGENTS``)."""
    holder = getattr(app, "threads_runtime", None)
    registry = getattr(holder, "schedules", None)
    if registry is None:
        registry = ScheduleRegistry()
    settings = getattr(holder, "settings", None)
    if settings is None:
        settings = Settings.from_env()
    if settings.agents:
        registry.load(settings.agents)
    return registry


class Scheduler(PersistentScheduler):
    """Celery's persistent scheduler, plus the declared schedules, published with their slot."""

    def setup_schedule(self) -> None:
        # The app's start-up check (threads_celery.worker.application.app_from_environment): a Beat that
        # cannot reach a migrated ledger or import its agents refuses to start, in one line.
        preflight = getattr(self.app, "threads_beat_preflight", None)
        if preflight is not None:
            preflight()
        holder = getattr(self.app, "threads_runtime", None)
        if holder is not None and not holder.settings.control_task_events:
            # Beat publishes only the backbone's tasks (ticks, scheduled-run starts): no task-sent
            # event for them, as their worker sends none (THREADS_CONTROL_TASK_EVENTS).
            self.app.conf.task_send_sent_event = False
        try:
            declared = beat_entries(schedules_for_app(self.app))
        except Exception:
            log.exception("beat: cannot load the scheduled batch agents; running the reconcile backbone only")
            declared = {}
        if declared:
            self.app.conf.beat_schedule = {**(self.app.conf.beat_schedule or {}), **declared}
            log.info("beat: scheduled batch agents: %s", ", ".join(sorted(declared)))
        # The default state file lives in .threads-celery/, which a fresh checkout does not have.
        # (PersistentScheduler sets schedule_filename; celery-types does not declare it.)
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
        super().setup_schedule()

    def apply_async(
        self, entry: ScheduleEntry, producer: Producer | None = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        schedule = entry.schedule
        if entry.task == RECONCILE_TASK:
            # The tick says when it was published, so a worker can tell that a later tick already
            # covered one that waited in the queue (threads_celery.decisions.backbone.tick_is_covered).
            if advance:
                self.reserve(entry)
            stamped = self.Entry(**_fields(entry, kwargs={**(entry.kwargs or {}), "published_at": time.time()}))
            return super().apply_async(stamped, producer, False, **kwargs)
        if entry.task != SCHEDULED_RUN_TASK or not isinstance(schedule, SlotSchedule):
            return super().apply_async(entry, producer, advance, **kwargs)
        last_published = _utc(entry.last_run_at) if entry.last_run_at else None
        if advance:
            self.reserve(entry)
        now = schedule.now()
        slot, gap = beat_slot(schedule.timing, schedule.missed, last_published, now)
        if slot is None:
            log.warning(
                "schedule %s: slots were missed since %s; skipping them (missed='skip'), next at %s",
                schedule.name, last_published, schedule.timing.next_after(now).isoformat(),
            )  # fmt: skip
            return None
        log.info(
            "schedule %s: publishing slot %s%s",
            schedule.name,
            slot.isoformat(),
            " (after a gap: missed='run_once')" if gap else "",
        )
        options = {**(entry.options or {}), "task_id": f"sched:{schedule.name}:{format_slot(slot)}"}
        publish = self.Entry(**_fields(entry, args=(schedule.name, slot.isoformat()), options=options))
        return super().apply_async(publish, producer, False, **kwargs)
