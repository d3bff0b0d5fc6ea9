"""Scheduled batch agents: runs started by Celery Beat on an interval or a crontab.

Declare schedules in the module that defines the agent, as a module-level list named
``SCHEDULES``; every module named in ``THREADS_AGENTS`` is searched for one::

    from datetime import timedelta
    from threads_celery.runtime.schedules import Schedule, crontab

    SCHEDULES = [
        Schedule("nightly-report", agent, "Write last night's report.", every=crontab(hour=2, minute=0)),
        Schedule(
            "inbox-sweep",
            "triage",
            "Sweep the inbox.",
            every=timedelta(minutes=15),
            thread="accumulate",
            missed="run_once",
        ),
    ]

How it runs. Beat (``celery -A tasks beat``, whose scheduler is ``threads_celery.worker.beat.Scheduler``) publishes
``threads.scheduled_run(schedule_name, slot_iso)`` once per slot. A *slot* is a point of the
schedule, computed by flooring the clock to it (``every=timedelta`` slots are multiples of the
interval since 1970-01-01 UTC, so ``timedelta(hours=1)`` fires on the hour; crontab slots are the
matching minutes in ``timezone``), never the moment a message happened to be published. The task
derives everything from the slot: the run id ``sched:<name>:<slot>`` (``slot`` written
``YYYYMMDDTHHMMSSZ``), and with ``thread="new"`` the thread id (the same string). Starting a run
is idempotent by run id, so two Beats publishing the same slot, or a redelivered message, start
one run.

Thread policy. ``thread="new"``: a fresh thread per slot. ``thread="accumulate"``: one thread per
schedule, ``sched:<name>``, where each run is queued behind the previous one and sees the
conversation so far. A change of the agent's configuration starts a new thread, so after a
deploy that changes the agent the schedule continues on ``sched:<name>~<first 12 characters of
the new config hash>``.

Missed slots. Celery Beat does not replay the slots that passed while it was down, and neither
do we. A slot that Beat publishes late (it was busy, or restarted within the interval) still
runs, once. When more than one slot passed since this Beat last published the schedule (a gap
longer than one interval), ``missed="skip"`` (the default) publishes nothing for the gap and the
schedule resumes at its next slot; ``missed="run_once"`` publishes one run, for the latest missed
slot (the current time floored to the schedule, so two Beats that both catch up agree on it),
then resumes. A Beat that starts with no schedule file knows no history: it starts at the next
slot.

Crontab fields follow Celery's ``crontab`` (``day_of_week`` 0 is Sunday; a day must match both
``day_of_month`` and ``day_of_week``, as in Celery). Intervals are whole seconds, at least one.
"""

from __future__ import annotations

import bisect
import importlib
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Literal, Protocol, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab
from sqlalchemy.exc import IntegrityError

from threads_celery.definitions.agents import Agent
from threads_celery.exceptions import ConfigError
from threads_celery.runtime.ports import Worker
from threads_celery.transitions import runs

if TYPE_CHECKING:
    from threads_celery.store import Tx

log = logging.getLogger("threads_celery.runtime.schedules")

SCHEDULED_RUN_TASK = "threads.scheduled_run"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SLOT_FORMAT = "%Y%m%dT%H%M%SZ"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


class _ExpandedCrontab(Protocol):
    """What celery's ``crontab`` sets at construction: each field as given and as expanded.

    celery-types does not declare these instance attributes, so :func:`_expanded` states them
    once, here, instead of silencing each read.
    """

    minute: set[int]
    hour: set[int]
    day_of_week: set[int]
    day_of_month: set[int]
    month_of_year: set[int]
    _orig_minute: str
    _orig_hour: str
    _orig_day_of_week: str
    _orig_day_of_month: str
    _orig_month_of_year: str


def _expanded(cron: crontab) -> _ExpandedCrontab:
    return cast(_ExpandedCrontab, cron)


# A crontab that matches once in 28 years (29 February on a Monday) is still found.
_MAX_DAYS = 366 * 29

ThreadPolicy = Literal["new", "accumulate"]
MissedPolicy = Literal["skip", "run_once"]

__all__ = [
    "SCHEDULED_RUN_TASK",
    "Schedule",
    "ScheduleRegistry",
    "Timing",
    "beat_slot",
    "crontab",
    "format_slot",
    "parse_slot",
    "start_scheduled_run",
]


# -- time --------------------------------------------------------------------------------------


def _utc(at: datetime) -> datetime:
    """``at`` as an aware UTC datetime; a naive value is taken to be UTC (as Celery does)."""
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    return at.astimezone(UTC)


def format_slot(slot: datetime) -> str:
    """The slot as it appears in run and thread ids: ``20250101T020000Z``."""
    return _utc(slot).strftime(SLOT_FORMAT)


def parse_slot(value: str) -> datetime:
    """A slot from its ISO 8601 form (with an offset, or ``Z``; naive means UTC)."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        raise ValueError(f"not an ISO 8601 slot: {value!r}") from None
    return _utc(parsed)


@dataclass(frozen=True)
class Timing:
    """When a schedule's slots are: every ``interval``, or the minutes a ``cron`` matches."""

    interval: timedelta | None = None
    cron: crontab | None = None
    tz: str = "UTC"

    def __post_init__(self) -> None:
        if (self.interval is None) == (self.cron is None):
            raise ConfigError("a timing is an interval or a crontab, exactly one of them")
        if self.interval is not None and (self.interval < timedelta(seconds=1) or self.interval % timedelta(seconds=1)):
            raise ConfigError(f"an interval must be a whole number of seconds, at least 1, not {self.interval}")
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(f"unknown timezone {self.tz!r}: {exc}") from None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def floor(self, at: datetime) -> datetime:
        """The latest slot at or before ``at`` (UTC)."""
        at = _utc(at)
        if self.interval is not None:
            return EPOCH + ((at - EPOCH) // self.interval) * self.interval
        return self._cron_search(at, backwards=True)

    def next_after(self, at: datetime) -> datetime:
        """The earliest slot strictly after ``at`` (UTC)."""
        at = _utc(at)
        if self.interval is not None:
            return self.floor(at) + self.interval
        return self._cron_search(at, backwards=False)

    def describe(self) -> str:
        if self.interval is not None:
            return f"every {self.interval}"
        assert self.cron is not None
        c = _expanded(self.cron)
        return (
            f"crontab({c._orig_minute} {c._orig_hour} {c._orig_day_of_month} "
            f"{c._orig_month_of_year} {c._orig_day_of_week}) {self.tz}"
        )

    # A day's slots, in UTC, sorted: local wall-clock minutes mapped through the zone (a time
    # that does not exist on a daylight-saving day maps as zoneinfo maps it, fold=0).
    def _day_slots(self, day: date) -> list[datetime]:
        assert self.cron is not None
        cron, zone = _expanded(self.cron), self.zone
        if day.month not in cron.month_of_year or day.day not in cron.day_of_month:
            return []
        if (day.weekday() + 1) % 7 not in cron.day_of_week:  # Celery: 0 is Sunday
            return []
        return sorted(
            datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone).astimezone(UTC)
            for hour in cron.hour
            for minute in cron.minute
        )

    def _cron_search(self, at: datetime, *, backwards: bool) -> datetime:
        local_day = at.astimezone(self.zone).date()
        step = timedelta(days=-1 if backwards else 1)
        day = local_day - step  # start one day on the other side: offsets can cross midnight
        for _ in range(_MAX_DAYS):
            slots = self._day_slots(day)
            if slots:
                if backwards:
                    i = bisect.bisect_right(slots, at)
                    if i:
                        return slots[i - 1]
                else:
                    i = bisect.bisect_right(slots, at)
                    if i < len(slots):
                        return slots[i]
            day += step
        raise ConfigError(f"{self.describe()} matches no time within {_MAX_DAYS} days")


def beat_slot(
    timing: Timing, missed: MissedPolicy, last_published: datetime | None, now: datetime
) -> tuple[datetime | None, bool]:
    """What Beat publishes at ``now``: ``(slot or None, whether slots were missed)``.

    Slots were missed when more than one slot passed since ``last_published`` (Beat was down
    for longer than one interval): with ``missed="skip"`` nothing is published for them; with
    ``run_once`` the latest one (``now`` floored to the schedule) is.
    """
    slot = timing.floor(now)
    if last_published is None:
        return slot, False
    first_due = timing.next_after(last_published)
    gap = first_due < slot
    if gap and missed == "skip":
        return None, True
    return slot, gap


# -- schedules ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Schedule:
    """A batch agent run on a schedule: ``agent`` gets ``message`` at every slot of ``every``.

    ``agent`` is an :class:`~threads_celery.Agent` or an agent's name; ``message`` is a string,
    or a function of the slot (an aware UTC datetime) that returns one. ``every`` is a
    ``timedelta`` or a Celery ``crontab(...)`` (read in ``timezone``, UTC by default).
    """

    name: str
    agent: Agent | str
    message: str | Callable[[datetime], str]
    every: timedelta | crontab
    thread: ThreadPolicy = "new"
    missed: MissedPolicy = "skip"
    enabled: bool = True
    timezone: str = "UTC"
    timing: Timing = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise ConfigError(
                f"schedule name {self.name!r} must be 1-40 lowercase letters, digits, '-' or '_' "
                "(it becomes part of run ids)"
            )
        if not isinstance(self.agent, (Agent, str)) or not self.agent_name:
            raise ConfigError(f"schedule {self.name!r}: agent must be an Agent or an agent name")
        if isinstance(self.message, str):
            if not self.message.strip():
                raise ConfigError(f"schedule {self.name!r}: the message is empty")
        elif not callable(self.message):
            raise ConfigError(f"schedule {self.name!r}: message must be a string or a function of the slot")
        if self.thread not in ("new", "accumulate"):
            raise ConfigError(f"schedule {self.name!r}: thread must be 'new' or 'accumulate', not {self.thread!r}")
        if self.missed not in ("skip", "run_once"):
            raise ConfigError(f"schedule {self.name!r}: missed must be 'skip' or 'run_once', not {self.missed!r}")
        if isinstance(self.every, timedelta):
            timing = Timing(interval=self.every, tz=self.timezone)
        elif isinstance(self.every, crontab):
            timing = Timing(cron=self.every, tz=self.timezone)
        else:
            raise ConfigError(
                f"schedule {self.name!r}: every must be a timedelta or a crontab(...), not {type(self.every).__name__}"
            )
        object.__setattr__(self, "timing", timing)

    @property
    def agent_name(self) -> str:
        return self.agent.name if isinstance(self.agent, Agent) else self.agent

    def floor(self, at: datetime) -> datetime:
        """The latest slot at or before ``at``."""
        return self.timing.floor(at)

    def next_after(self, at: datetime) -> datetime:
        """The first slot after ``at``."""
        return self.timing.next_after(at)

    def run_id(self, slot: datetime) -> str:
        """``sched:<name>:<slot>``: the id of the one run this slot starts."""
        return f"sched:{self.name}:{format_slot(slot)}"

    def thread_id(self, slot: datetime) -> str:
        """The thread a slot's run goes to (``accumulate`` before any config change)."""
        return self.run_id(slot) if self.thread == "new" else f"sched:{self.name}"

    def message_for(self, slot: datetime) -> str:
        text = self.message(_utc(slot)) if callable(self.message) else self.message
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"schedule {self.name!r}: the message function returned {text!r}, not a string")
        return text

    def same_as(self, other: Schedule) -> bool:
        return (
            self.name == other.name
            and self.agent_name == other.agent_name
            and self.timing == other.timing
            and self.thread == other.thread
            and self.missed == other.missed
            and self.enabled == other.enabled
            and (self.message == other.message if isinstance(self.message, str) else self.message is other.message)
        )


class ScheduleRegistry:
    """The schedules a process knows, by name; filled from ``SCHEDULES`` in agent modules."""

    def __init__(self, schedules: Iterable[Schedule] = ()) -> None:
        self._schedules: dict[str, Schedule] = {}
        self._lock = threading.Lock()
        for schedule in schedules:
            self.add(schedule)

    def add(self, schedule: Schedule) -> Schedule:
        if not isinstance(schedule, Schedule):
            raise ConfigError(f"SCHEDULES may hold only Schedule values, not {type(schedule).__name__}")
        with self._lock:
            current = self._schedules.get(schedule.name)
            if current is not None and current is not schedule and not current.same_as(schedule):
                raise ConfigError(f"schedule name {schedule.name!r} is declared twice, differently")
            self._schedules[schedule.name] = schedule
        return schedule

    def get(self, name: str) -> Schedule | None:
        return self._schedules.get(name)

    def __iter__(self) -> Iterator[Schedule]:
        return iter(list(self._schedules.values()))

    def __len__(self) -> int:
        return len(self._schedules)

    def load(self, specs: str | Iterable[str]) -> list[Schedule]:
        """Add the ``SCHEDULES`` of each module named by ``module`` or ``module:attr`` specs."""
        if isinstance(specs, str):
            specs = [s.strip() for s in specs.split(",") if s.strip()]
        found: list[Schedule] = []
        for spec in specs:
            module_name = spec.partition(":")[0]
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ConfigError(f"cannot import agent module {module_name!r}: {exc}") from exc
            declared = getattr(module, "SCHEDULES", None)
            if declared is None:
                continue
            if isinstance(declared, Schedule) or not isinstance(declared, (list, tuple)):
                raise ConfigError(f"{module_name}.SCHEDULES must be a list of Schedule values")
            found.extend(self.add(s) for s in declared)
        return found


# -- starting a slot's run (the worker side) --------------------------------------------------


def start_scheduled_run(worker: Worker, schedules: ScheduleRegistry, name: str, slot_iso: str | None) -> str:
    """Start the run of one slot of schedule ``name``, unless it exists. Returns what happened.

    ``worker`` is the worker's runtime (its store, agent registry, publisher and clock: see
    :class:`~threads_celery.runtime.ports.Worker`). The slot is floored to the schedule, so a slot published by
    a Beat whose clock or definition differs slightly still maps to a slot of this schedule.
    """
    schedule = schedules.get(name)
    if schedule is None:
        log.error("scheduled run for unknown schedule %r: is its module in THREADS_AGENTS?", name)
        return f"unknown schedule {name}"
    if not schedule.enabled:
        return f"schedule {name} is disabled"
    slot = schedule.floor(parse_slot(slot_iso) if slot_iso else worker.clock())
    run_id = schedule.run_id(slot)
    registry = worker.registry
    agent_name = schedule.agent_name
    if isinstance(schedule.agent, Agent) and agent_name not in registry:
        registry.add(schedule.agent)
    for _ in range(3):
        try:
            with worker.store.transaction() as tx:
                if tx.get_run(run_id) is not None:
                    return f"exists {run_id}"
                now = worker.clock()
                if agent_name in registry:
                    agent = registry.get(agent_name)
                    config_hash = agent.config_hash()
                    if tx.agent_hash(agent_name) != config_hash:
                        tx.upsert_agent(agent_name, config_hash, agent.describe(), now)
                else:
                    stored_hash = tx.agent_hash(agent_name)
                    if stored_hash is None:
                        log.error("schedule %r: agent %r is not registered anywhere", name, agent_name)
                        return f"unknown agent {agent_name}"
                    config_hash = stored_hash
                run, entries = runs.submit_run(
                    tx,
                    agent=agent_name,
                    config_hash=config_hash,
                    message=schedule.message_for(slot),
                    now=now,
                    thread_id=_thread_for(tx, schedule, slot, agent_name, config_hash),
                    run_id=run_id,
                    input_meta={"schedule": name, "slot": slot.isoformat()},
                )
        except IntegrityError:
            # Another delivery of this slot (a second Beat, a redelivery) inserted the same run
            # or thread first; read again.
            continue
        worker.publish(entries)
        log.info("schedule %s: started run %s on thread %s", name, run.id, run.thread_id)
        return f"started {run_id}"
    raise RuntimeError(f"schedule {name}: could not start or find run {run_id}")


def _thread_for(tx: Tx, schedule: Schedule, slot: datetime, agent_name: str, config_hash: str) -> str:
    thread_id = schedule.thread_id(slot)
    if schedule.thread != "accumulate":
        return thread_id
    row = tx.get_thread(thread_id)
    if row is None or (row.agent == agent_name and row.config_hash == config_hash):
        return thread_id
    return f"{thread_id}~{config_hash[:12]}"
