"""Scheduled batch agents: slots, run ids, missed-slot policy, Beat's publishing, thread policies.

The first half is pure (slot arithmetic on interval and crontab schedules, the Beat decision);
the second drives ``threads_celery.worker.beat.Scheduler`` with a recording publisher; the last half calls
the real ``threads.scheduled_run`` task on the embedded runtime (SQLite and the in-process
worker), so runs are started and completed for real.
"""

from __future__ import annotations

import itertools
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from threads_celery import Agent, Settings, Threads, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import ConfigError
from threads_celery.runtime.schedules import (
    SCHEDULED_RUN_TASK,
    Schedule,
    ScheduleRegistry,
    Timing,
    beat_slot,
    crontab,
    format_slot,
    parse_slot,
    start_scheduled_run,
)
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow
from threads_celery.worker.application import create_app
from threads_celery.worker.beat import ENTRY_PREFIX, Scheduler, SlotSchedule, beat_entries
from threads_celery.worker.tasks import SCHEDULED_RUN_TASK as WORKER_TASK_NAME

WAIT_S = 30.0
_names = itertools.count()


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def every(seconds: float) -> Timing:
    return Timing(interval=timedelta(seconds=seconds))


# -- slots: intervals -------------------------------------------------------------------------


def test_interval_slots_are_multiples_of_the_interval_since_the_epoch() -> None:
    hourly = every(3600)
    assert hourly.floor(at(2025, 5, 4, 13, 59, 59)) == at(2025, 5, 4, 13)
    assert hourly.floor(at(2025, 5, 4, 13)) == at(2025, 5, 4, 13)  # a slot is its own floor
    assert hourly.next_after(at(2025, 5, 4, 13)) == at(2025, 5, 4, 14)  # strictly after
    quarter = every(900)
    assert quarter.floor(at(2025, 5, 4, 13, 44, 59, 999999)) == at(2025, 5, 4, 13, 30)
    second = every(1)
    assert second.floor(datetime(2025, 5, 4, 13, 0, 7, 999999, tzinfo=UTC)) == at(2025, 5, 4, 13, 0, 7)


def test_interval_slots_ignore_the_offset_the_time_is_written_in() -> None:
    hourly = every(3600)
    paris_summer = timezone(timedelta(hours=2))
    assert hourly.floor(datetime(2025, 5, 4, 15, 30, tzinfo=paris_summer)) == at(2025, 5, 4, 13)
    assert hourly.floor(datetime(2025, 5, 4, 13, 30)) == at(2025, 5, 4, 13)  # naive is UTC


@settings(max_examples=200, deadline=None)
@given(
    seconds=st.sampled_from([1, 7, 60, 900, 3600, 86400]),
    when=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1)),
)
def test_interval_floor_and_next_bracket_every_time(seconds: int, when: datetime) -> None:
    timing = every(seconds)
    when = when.replace(tzinfo=UTC)
    low, high = timing.floor(when), timing.next_after(when)
    assert low <= when < high
    assert high - low == timedelta(seconds=seconds)
    assert timing.floor(low) == low and timing.floor(high) == high


# -- slots: crontabs --------------------------------------------------------------------------


def test_a_nightly_crontab_floors_to_the_latest_two_oclock() -> None:
    nightly = Timing(cron=crontab(hour=2, minute=0))
    assert nightly.floor(at(2025, 3, 10, 1, 59)) == at(2025, 3, 9, 2)
    assert nightly.floor(at(2025, 3, 10, 2, 0)) == at(2025, 3, 10, 2)
    assert nightly.floor(at(2025, 3, 10, 23, 0)) == at(2025, 3, 10, 2)
    assert nightly.next_after(at(2025, 3, 10, 2, 0)) == at(2025, 3, 11, 2)
    assert nightly.next_after(at(2025, 3, 10, 1, 0)) == at(2025, 3, 10, 2)
    # Across a month and a year end.
    assert nightly.floor(at(2025, 1, 1, 0, 30)) == at(2024, 12, 31, 2)


def test_weekday_and_day_of_month_crontabs() -> None:
    weekdays = Timing(cron=crontab(hour=9, minute=30, day_of_week="mon-fri"))
    saturday = at(2025, 3, 15, 12)  # 15 March 2025 is a Saturday
    assert weekdays.floor(saturday) == at(2025, 3, 14, 9, 30)  # Friday
    assert weekdays.next_after(saturday) == at(2025, 3, 17, 9, 30)  # Monday
    monthly = Timing(cron=crontab(hour=0, minute=0, day_of_month=1))
    assert monthly.floor(at(2025, 3, 15)) == at(2025, 3, 1)
    assert monthly.next_after(at(2025, 3, 15)) == at(2025, 4, 1)
    # Celery's semantics: a day must match both day_of_month and day_of_week.
    first_monday = Timing(cron=crontab(hour=8, minute=0, day_of_month="1-7", day_of_week="mon"))
    assert first_monday.next_after(at(2025, 3, 1)) == at(2025, 3, 3, 8)
    assert first_monday.floor(at(2025, 3, 2)) == at(2025, 2, 3, 8)


def test_a_crontab_is_read_in_its_timezone_daylight_saving_included() -> None:
    paris = Timing(cron=crontab(hour=2, minute=0), tz="Europe/Paris")
    assert paris.floor(at(2025, 1, 15, 12)) == at(2025, 1, 15, 1)  # CET, UTC+1
    assert paris.floor(at(2025, 7, 15, 12)) == at(2025, 7, 15, 0)  # CEST, UTC+2
    # Just after 02:00 Paris time in summer (00:30 UTC) the slot of that day is due.
    assert paris.floor(at(2025, 7, 15, 0, 30)) == at(2025, 7, 15, 0)


@settings(max_examples=100, deadline=None)
@given(
    cron=st.sampled_from(
        [
            crontab(hour=2, minute=0),
            crontab(minute="*/15"),
            crontab(hour="9-17", minute=0, day_of_week="mon-fri"),
            crontab(hour=0, minute=0, day_of_month=29, month_of_year=2),
        ]
    ),
    tz=st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
    when=st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2080, 1, 1)),
)
def test_crontab_floor_and_next_bracket_every_time(cron: crontab, tz: str, when: datetime) -> None:
    timing = Timing(cron=cron, tz=tz)
    when = when.replace(tzinfo=UTC)
    low, high = timing.floor(when), timing.next_after(when)
    assert low <= when < high
    assert timing.floor(low) == low
    assert timing.next_after(low) > low


# -- run ids and validation -------------------------------------------------------------------


def test_run_and_thread_ids_derive_from_the_slot_alone() -> None:
    nightly = Schedule("nightly-report", "reporter", "report", every=crontab(hour=2, minute=0))
    slot = nightly.floor(at(2025, 3, 10, 2, 0, 41))
    assert nightly.run_id(slot) == "sched:nightly-report:20250310T020000Z"
    assert nightly.thread_id(slot) == nightly.run_id(slot)  # thread="new": a thread per slot
    # The same instant written with another offset is the same slot and the same run.
    paris = datetime(2025, 3, 10, 3, 0, tzinfo=timezone(timedelta(hours=1)))
    assert nightly.run_id(nightly.floor(paris)) == nightly.run_id(slot)
    assert nightly.run_id(parse_slot(slot.isoformat())) == nightly.run_id(parse_slot("2025-03-10T02:00:00Z"))
    accumulate = Schedule("inbox", "triage", "sweep", every=timedelta(minutes=5), thread="accumulate")
    assert accumulate.thread_id(at(2025, 1, 1)) == accumulate.thread_id(at(2025, 6, 1)) == "sched:inbox"


def test_the_longest_schedule_name_still_fits_the_id_columns() -> None:
    longest = Schedule("x" * 40, "agent", "go", every=timedelta(seconds=1))
    assert len(longest.run_id(at(2099, 12, 31, 23, 59, 59))) <= 64
    accumulating = Schedule("x" * 40, "agent", "go", every=timedelta(seconds=1), thread="accumulate")
    assert len(f"{accumulating.thread_id(at(2099, 1, 1))}~{'f' * 12}") <= 64  # after a config change


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Nightly"}, "schedule name"),
        ({"name": "x" * 41}, "schedule name"),
        ({"name": "a:b"}, "schedule name"),
        ({"every": timedelta(milliseconds=500)}, "whole number of seconds"),
        ({"every": timedelta(0)}, "whole number of seconds"),
        ({"every": 60}, "timedelta or a crontab"),
        ({"thread": "shared"}, "thread must be"),
        ({"missed": "replay"}, "missed must be"),
        ({"timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"message": "  "}, "message is empty"),
        ({"agent": 3}, "agent must be"),
    ],
)
def test_bad_schedules_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    values: dict[str, Any] = {"name": "ok", "agent": "agent", "message": "go", "every": timedelta(hours=1)}
    values.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        Schedule(**values)


def test_a_message_function_gets_the_slot() -> None:
    daily = Schedule("daily", "a", lambda slot: f"report for {slot.date()}", every=crontab(hour=2, minute=0))
    assert daily.message_for(at(2025, 3, 10, 2)) == "report for 2025-03-10"
    empty = Schedule("empty", "a", lambda slot: "", every=timedelta(hours=1))
    with pytest.raises(ConfigError, match="message function returned"):
        empty.message_for(at(2025, 3, 10, 2))


def test_format_and_parse_slot() -> None:
    assert format_slot(at(2025, 3, 10, 2)) == "20250310T020000Z"
    assert parse_slot("2025-03-10T02:00:00Z") == at(2025, 3, 10, 2)
    assert parse_slot("2025-03-10T03:00:00+01:00") == at(2025, 3, 10, 2)
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_slot("yesterday")


# -- the missed-slot policy (Beat's decision) -------------------------------------------------


def test_an_on_time_or_late_tick_publishes_its_slot() -> None:
    second = every(1)
    last = datetime(2025, 1, 1, 0, 0, 0, 3000, tzinfo=UTC)  # published slot 00:00:00
    on_time = datetime(2025, 1, 1, 0, 0, 1, 2000, tzinfo=UTC)
    assert beat_slot(second, "skip", last, on_time) == (at(2025, 1, 1, 0, 0, 1), False)
    late = datetime(2025, 1, 1, 0, 0, 1, 900000, tzinfo=UTC)  # late, but still the next slot
    assert beat_slot(second, "skip", last, late) == (at(2025, 1, 1, 0, 0, 1), False)
    # A nightly slot published at 03:30 after Beat was down 01:00-03:30: only that slot
    # passed, so it is late, not missed, and runs whatever the policy.
    nightly = Timing(cron=crontab(hour=2, minute=0))
    assert beat_slot(nightly, "skip", at(2025, 3, 9, 2, 0, 1), at(2025, 3, 10, 3, 30)) == (at(2025, 3, 10, 2), False)


def test_after_a_gap_skip_publishes_nothing_and_run_once_the_latest_missed_slot() -> None:
    nightly = Timing(cron=crontab(hour=2, minute=0))
    last = at(2025, 3, 6, 2, 0, 1)  # Beat was down for the 7th, 8th, 9th and 10th
    now = at(2025, 3, 10, 9, 15)
    assert beat_slot(nightly, "skip", last, now) == (None, True)
    assert beat_slot(nightly, "run_once", last, now) == (at(2025, 3, 10, 2), True)
    # Two Beats catching up at different moments of the same slot agree on it.
    assert beat_slot(nightly, "run_once", last, at(2025, 3, 10, 23, 59))[0] == at(2025, 3, 10, 2)
    minutely = every(60)
    assert beat_slot(minutely, "run_once", at(2025, 1, 1, 0, 0, 0), at(2025, 1, 1, 0, 5, 30)) == (
        at(2025, 1, 1, 0, 5),
        True,
    )


def test_without_history_the_current_slot_is_published() -> None:
    assert beat_slot(every(60), "skip", None, at(2025, 1, 1, 0, 5, 30)) == (at(2025, 1, 1, 0, 5), False)


# -- Beat: the scheduler ----------------------------------------------------------------------


def test_a_slot_schedule_is_due_at_its_next_slot_not_an_interval_after_the_last_publish() -> None:
    schedule = SlotSchedule("s", every(10))
    fixed = datetime(2025, 1, 1, 0, 0, 19, 500000, tzinfo=UTC)
    schedule.now = lambda: fixed  # type: ignore[method-assign]
    # Published at 00:00:09.9 (late for slot 00:00:00): due at 00:00:10, not at 00:00:19.9.
    due, next_in = schedule.is_due(datetime(2025, 1, 1, 0, 0, 9, 900000, tzinfo=UTC))
    assert due is True and next_in == pytest.approx(0.5)
    due, wait = schedule.is_due(datetime(2025, 1, 1, 0, 0, 10, 100000, tzinfo=UTC))
    assert due is False and wait == pytest.approx(0.5)


@pytest.fixture
def beat_app() -> Iterator[Any]:
    app = create_app(Settings(), AgentRegistry(), broker_url="memory://")
    yield app


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        self.sent.append((tuple(args or ()), options))
        return SimpleNamespace(id=options.get("task_id"))


def test_the_scheduler_adds_declared_schedules_next_to_the_reconcile_backbone(beat_app: Any, tmp_path: Path) -> None:
    assert beat_app.conf.beat_scheduler == "threads_celery.worker.beat:Scheduler"
    holder = beat_app.threads_runtime
    holder.schedules.add(Schedule("tick", "agent", "go", every=timedelta(seconds=1)))
    holder.schedules.add(Schedule("off", "agent", "go", every=timedelta(seconds=1), enabled=False))
    scheduler = Scheduler(beat_app, schedule_filename=str(tmp_path / "beat"))
    try:
        names = set(scheduler.schedule)
        assert f"{ENTRY_PREFIX}tick" in names and "threads-reconcile" in names
        assert f"{ENTRY_PREFIX}off" not in names  # disabled schedules are not published
        entry = scheduler.schedule[f"{ENTRY_PREFIX}tick"]
        assert entry.task == SCHEDULED_RUN_TASK == WORKER_TASK_NAME
        assert SCHEDULED_RUN_TASK in beat_app.tasks
    finally:
        scheduler.close()


def _entry(scheduler: Scheduler, last_run_at: datetime) -> Any:
    entry = next(iter(e for n, e in scheduler.schedule.items() if n.startswith(ENTRY_PREFIX)))
    entry.last_run_at = last_run_at
    return entry


@pytest.mark.parametrize("missed", ["skip", "run_once"])
def test_the_scheduler_publishes_the_slot_and_applies_the_missed_policy(
    beat_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missed: str
) -> None:
    beat_app.threads_runtime.schedules.add(Schedule("tick", "agent", "go", every=timedelta(minutes=1), missed=missed))  # type: ignore[arg-type]
    recorder = Recorder()
    monkeypatch.setattr(beat_app.tasks[SCHEDULED_RUN_TASK], "apply_async", recorder)
    now = datetime(2025, 3, 10, 12, 30, 0, 250000, tzinfo=UTC)
    monkeypatch.setattr(SlotSchedule, "now", lambda self: now)
    scheduler = Scheduler(beat_app, schedule_filename=str(tmp_path / "beat"))
    try:
        slot = at(2025, 3, 10, 12, 30)
        # On time: the previous slot was published just after it began.
        scheduler.apply_async(_entry(scheduler, slot - timedelta(minutes=1) + timedelta(milliseconds=5)), advance=False)
        assert recorder.sent == [(("tick", slot.isoformat()), recorder.sent[0][1])]
        assert recorder.sent[0][1]["task_id"] == f"sched:tick:{format_slot(slot)}"
        # After an hour's gap.
        recorder.sent.clear()
        scheduler.apply_async(_entry(scheduler, slot - timedelta(hours=1)), advance=False)
        published = [args for args, _ in recorder.sent]
        assert published == ([] if missed == "skip" else [("tick", slot.isoformat())])
    finally:
        scheduler.close()


def test_the_scheduler_stamps_each_reconcile_tick_with_its_publish_time(
    beat_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[Any, Any, dict[str, Any]]] = []
    monkeypatch.setattr(
        beat_app.tasks["threads.reconcile"],
        "apply_async",
        lambda args=None, kwargs=None, **options: sent.append((args, kwargs, options)),
    )
    scheduler = Scheduler(beat_app, schedule_filename=str(tmp_path / "beat"))
    try:
        before = time.time()
        scheduler.apply_async(scheduler.schedule["threads-reconcile"], advance=False)
        scheduler.apply_async(scheduler.schedule["threads-reconcile"], advance=False)
        after = time.time()
        assert [tuple(args) for args, _, _ in sent] == [(), ()]
        stamps = [kwargs["published_at"] for _, kwargs, _ in sent]
        assert before <= stamps[0] <= stamps[1] <= after
        control = beat_app.conf.task_default_queue + ".control"
        assert all(options["queue"] == control and "expires" not in options for _, _, options in sent)
    finally:
        scheduler.close()


# -- loading SCHEDULES from agent modules -----------------------------------------------------


def _module(tmp_path: Path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def test_schedules_are_found_in_the_agent_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    name = _module(
        tmp_path,
        f"sched_module_{next(_names)}",
        """
        from datetime import timedelta
        from threads_celery import Agent
        from threads_celery.runtime.schedules import Schedule, crontab
        from threads_celery.testing import ScriptedModel, say

        agent = Agent(name="loader", instructions="", model=ScriptedModel([say("ok")]))
        SCHEDULES = [
            Schedule("every-minute", agent, "go", every=timedelta(minutes=1)),
            Schedule("nightly", "loader", "go", every=crontab(hour=2, minute=0), missed="run_once"),
        ]
        """,
    )
    plain = _module(tmp_path, f"plain_module_{next(_names)}", "X = 1\n")
    registry = ScheduleRegistry()
    loaded = registry.load(f"{name}:agent, {plain}")
    assert [s.name for s in loaded] == ["every-minute", "nightly"]
    assert registry.load([name]) and len(registry) == 2  # loading twice is harmless
    entries = beat_entries(registry)
    assert set(entries) == {f"{ENTRY_PREFIX}every-minute", f"{ENTRY_PREFIX}nightly"}
    assert entries[f"{ENTRY_PREFIX}nightly"]["schedule"].missed == "run_once"


def test_a_schedule_name_declared_twice_differently_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ScheduleRegistry([Schedule("dup", "a", "go", every=timedelta(minutes=1))])
    registry.add(Schedule("dup", "a", "go", every=timedelta(minutes=1)))  # the same: fine
    with pytest.raises(ConfigError, match="declared twice"):
        registry.add(Schedule("dup", "a", "go", every=timedelta(minutes=2)))
    monkeypatch.syspath_prepend(str(tmp_path))
    bad = _module(tmp_path, f"bad_module_{next(_names)}", "SCHEDULES = ['nightly']\n")
    with pytest.raises(ConfigError, match="only Schedule values"):
        ScheduleRegistry().load(bad)


# -- the scheduled_run task on the embedded runtime -------------------------------------------


def unique(base: str) -> str:
    return f"{base}-{next(_names)}"


def run_task(threads: Threads, name: str, slot: datetime | str) -> str:
    """Call the real ``threads.scheduled_run`` task in this process, as a worker would."""
    task = threads.app.tasks[SCHEDULED_RUN_TASK]
    return task(name, slot if isinstance(slot, str) else slot.isoformat())


def scheduled_runs(threads: Threads, name: str) -> list[Any]:
    return [r for r in threads.runs(limit=1000) if r.id.startswith(f"sched:{name}:")]


def reporter(name: str, text: str = "report done") -> Agent:
    return Agent(name=name, instructions="Report.", model=ScriptedModel([say(text)]))


def add(threads: Threads, schedule: Schedule) -> Schedule:
    return threads.app.threads_runtime.schedules.add(schedule)  # type: ignore[attr-defined]


def test_two_deliveries_of_one_slot_start_one_run(threads: Threads) -> None:
    name = unique("twice")
    schedule = add(threads, Schedule(name, reporter(unique("reporter")), "nightly report", every=timedelta(hours=1)))
    slot = at(2025, 3, 10, 2)
    run_id = f"sched:{name}:20250310T020000Z"
    assert run_task(threads, name, slot) == f"started {run_id}"
    assert run_task(threads, name, slot) == f"exists {run_id}"
    # A slot published off the schedule's grid (a Beat with a skewed clock) floors to the same.
    assert run_task(threads, name, slot + timedelta(minutes=20)) == f"exists {run_id}"
    run = threads.wait(run_id, timeout=WAIT_S)
    assert run.status == "completed" and run.output == "report done"
    assert [r.id for r in scheduled_runs(threads, name)] == [run_id]
    assert run.thread_id == schedule.thread_id(slot) == run_id
    assert run.input_meta == {"schedule": name, "slot": "2025-03-10T02:00:00+00:00"}
    user_messages = [m for m in threads.messages(run.thread_id) if m.role == "user"]
    assert [m.text for m in user_messages] == ["nightly report"]


def test_concurrent_deliveries_of_one_slot_start_one_run(threads: Threads) -> None:
    name = unique("race")
    add(threads, Schedule(name, reporter(unique("reporter")), "go", every=timedelta(minutes=1)))
    slot = at(2025, 3, 10, 2, 7)
    results: list[str] = []
    barrier = threading.Barrier(4)

    def deliver() -> None:
        barrier.wait(WAIT_S)
        results.append(run_task(threads, name, slot))

    workers = [threading.Thread(target=deliver) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(WAIT_S)
    assert sorted(r.split()[0] for r in results) == ["exists", "exists", "exists", "started"]
    assert len(scheduled_runs(threads, name)) == 1


def test_thread_new_gives_each_slot_a_thread_of_its_own(threads: Threads) -> None:
    name = unique("fresh")
    add(threads, Schedule(name, reporter(unique("reporter")), "go", every=timedelta(hours=1)))
    for hour in (1, 2):
        run_task(threads, name, at(2025, 3, 10, hour))
    found = scheduled_runs(threads, name)
    assert len(found) == 2
    assert len({r.thread_id for r in found}) == 2
    for r in found:
        assert threads.wait(r.id, timeout=WAIT_S).status == "completed"
        assert [m.role for m in threads.messages(r.thread_id)] == ["user", "assistant"]


class GateIn(BaseModel):
    pass


def test_thread_accumulate_queues_each_run_behind_the_previous_on_one_thread(threads: Threads) -> None:
    name = unique("acc")
    entered, opened = threading.Event(), threading.Event()

    def wait_for_gate(inp: GateIn, ctx: Any) -> str:
        entered.set()
        if not opened.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return "gathered"

    gate = tool(name="gather", description="Gather figures.", input=GateIn, effect="read_only", execute=wait_for_gate)
    # Each run: call the tool (only the first run blocks on the gate), then answer.
    agent = Agent(
        name=unique("acc_agent"), instructions="", model=ScriptedModel([call("gather"), say("summary")]), tools=[gate]
    )
    schedule = add(
        threads,
        Schedule(name, agent, lambda slot: f"report {slot:%H:%M}", every=timedelta(hours=1), thread="accumulate"),
    )
    first, second = at(2025, 3, 10, 1), at(2025, 3, 10, 2)
    run_task(threads, name, first)
    assert entered.wait(WAIT_S), "the first run never reached its tool"
    run_task(threads, name, second)
    first_id, second_id = schedule.run_id(first), schedule.run_id(second)
    assert threads.get_run(second_id).status == "queued"  # behind the first, on the same thread
    opened.set()
    for run_id in (first_id, second_id):
        assert threads.wait(run_id, timeout=WAIT_S).status == "completed"
    thread_id = f"sched:{name}"
    assert {threads.get_run(first_id).thread_id, threads.get_run(second_id).thread_id} == {thread_id}
    roles_texts = [(m.role, m.text) for m in threads.messages(thread_id) if m.role == "user"]
    assert roles_texts == [("user", "report 01:00"), ("user", "report 02:00")]


def test_accumulate_moves_to_a_new_thread_when_the_agent_changes(threads: Threads) -> None:
    name, agent_name = unique("deploy"), unique("deployed")
    before = reporter(agent_name, "v1")
    add(threads, Schedule(name, before, "go", every=timedelta(hours=1), thread="accumulate"))
    run_task(threads, name, at(2025, 3, 10, 1))
    assert threads.wait(f"sched:{name}:20250310T010000Z", timeout=WAIT_S).thread_id == f"sched:{name}"
    # A worker after a deploy: the same agent name with other instructions.
    after = Agent(name=agent_name, instructions="Report, briefly.", model=ScriptedModel([say("v2")]))
    assert after.config_hash() != before.config_hash()
    registry = AgentRegistry()
    registry.add(after)
    redeployed = SimpleNamespace(store=threads.store, registry=registry, publish=threads.publisher, clock=utcnow)
    schedules = ScheduleRegistry([Schedule(name, after, "go", every=timedelta(hours=1), thread="accumulate")])
    start_scheduled_run(redeployed, schedules, name, at(2025, 3, 10, 2).isoformat())
    run = threads.get_run(f"sched:{name}:20250310T020000Z")
    assert run.thread_id == f"sched:{name}~{after.config_hash()[:12]}"


def test_unknown_and_disabled_schedules_start_nothing(threads: Threads) -> None:
    assert run_task(threads, "no-such-schedule", at(2025, 1, 1)) == "unknown schedule no-such-schedule"
    name = unique("off")
    add(threads, Schedule(name, reporter(unique("reporter")), "go", every=timedelta(hours=1), enabled=False))
    assert run_task(threads, name, at(2025, 1, 1)) == f"schedule {name} is disabled"
    assert scheduled_runs(threads, name) == []
    unregistered = unique("ghost")
    add(threads, Schedule(unregistered, "nobody-registered-this", "go", every=timedelta(hours=1)))
    assert run_task(threads, unregistered, at(2025, 1, 1)) == "unknown agent nobody-registered-this"
    assert scheduled_runs(threads, unregistered) == []


def test_the_batch_example_writes_a_report_for_the_night_before_the_slot(threads: Threads) -> None:
    from examples import batch

    (nightly,) = batch.SCHEDULES
    assert nightly.name == "nightly-report" and nightly.missed == "run_once" and nightly.thread == "new"
    if not isinstance(nightly.every, timedelta):  # BATCH_EVERY_S unset: the real schedule
        assert nightly.floor(at(2025, 3, 10, 9, 30)) == at(2025, 3, 10, 2)
    add(threads, nightly)
    slot = at(2025, 3, 10, 2)
    assert run_task(threads, "nightly-report", slot) == "started sched:nightly-report:20250310T020000Z"
    run = threads.wait("sched:nightly-report:20250310T020000Z", timeout=WAIT_S)
    assert run.status == "completed", run.error
    assert run.input == "Write the sales report for 2025-03-09."
    assert run.output is not None and run.output.startswith("Sales report for 2025-03-09\n- Orders: ")
    calls = [c.name for m in threads.messages(run.thread_id) for c in m.tool_calls]
    assert calls == ["gather_figures"]


def test_beat_keeps_the_reconcile_backbone_when_the_agent_modules_fail_to_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(Settings(agents=("no_such_module_for_beat",)), AgentRegistry(), broker_url="memory://")
    scheduler = Scheduler(app, schedule_filename=str(tmp_path / "beat"))
    try:
        assert set(scheduler.schedule) >= {"threads-reconcile"}
        assert not any(name.startswith(ENTRY_PREFIX) for name in scheduler.schedule)
        assert "cannot load the scheduled batch agents" in caplog.text
    finally:
        scheduler.close()
