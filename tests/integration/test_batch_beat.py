"""Scheduled batch agents under two real ``celery beat`` processes and a real worker.

Two Beats (each with its own schedule file, in its own directory) publish the same one-second
schedules to Redis; a prefork worker on PostgreSQL runs them. Each published slot must end up
as exactly one run, whichever Beat's message arrived first, and every run must complete. Then
one Beat is restarted after a gap of several slots, to see the missed-slot policies act:
``skip`` publishes nothing for the gap, ``run_once`` publishes the latest missed slot.

The agents module is written to a temporary directory at test time and reaches the processes
through ``PYTHONPATH`` and ``THREADS_AGENTS``. The broker is a Redis database of this module's
own (``THREADS_TEST_BATCH_REDIS_DB``, default 14), flushed first, so no other suite's worker
takes these tasks.
"""

from __future__ import annotations

import os
import re
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.processes import (
    REPO_ROOT,
    BeatProcess,
    ManagedProcess,
    WorkerProcess,
    subprocess_env,
)
from tests.support.waiting import eventually

T = TypeVar("T")
WAIT_S = 60.0
AGENTS_MODULE = "batch_beat_agents"
AGENTS_SOURCE = textwrap.dedent(
    """
    from datetime import timedelta

    from threads_celery import Agent
    from threads_celery.runtime.schedules import Schedule
    from threads_celery.testing import ScriptedModel, say

    ticker = Agent(name="it_ticker", instructions="Tick.", model=ScriptedModel([say("tick done")]))

    SCHEDULES = [
        Schedule("it-tick", ticker, "tick", every=timedelta(seconds=1)),  # missed="skip"
        Schedule("it-acc", ticker, "tock", every=timedelta(seconds=1), thread="accumulate", missed="run_once"),
    ]
    """
)
PUBLISHED = re.compile(r"schedule (it-tick|it-acc): publishing slot (\S+)( \(after a gap)?")


def published(process: ManagedProcess, schedule: str) -> list[str]:
    """The slots (ISO) that a Beat's log says it published for ``schedule``, in order."""
    return [m.group(2) for m in PUBLISHED.finditer(process.log_text()) if m.group(1) == schedule]


def surely_sent(process: ManagedProcess, schedule: str) -> set[str]:
    """The slots a stopped Beat certainly sent: every one it logged but the last.

    Beat logs a slot just before it sends it, and sends the next only after; one stopped between
    the two never sent its last, and no run for that slot is owed.
    """
    return set(published(process, schedule)[:-1])


@pytest.fixture
def batch_redis_url(redis_url: str) -> str:
    """A Redis database for this module's processes alone, flushed now."""
    from urllib.parse import urlsplit

    import redis

    raw_db = os.environ.get("THREADS_TEST_BATCH_REDIS_DB", "14")
    if not raw_db.isdigit() or not 1 <= int(raw_db) <= 15:
        pytest.fail(f"THREADS_TEST_BATCH_REDIS_DB must be an integer in 1..15, got {raw_db!r}")
    parts = urlsplit(redis_url)
    client = redis.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=int(raw_db))
    try:
        client.flushdb()
    finally:
        client.close()
    return f"redis://{parts.hostname}:{parts.port}/{raw_db}"


@pytest.fixture
def services(migrated_pg_url: str, batch_redis_url: str, tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """``start(kind, name, cwd=None)`` starts ``celery -A tasks <kind>``; all are stopped after the test."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / f"{AGENTS_MODULE}.py").write_text(AGENTS_SOURCE)
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": batch_redis_url,
            "THREADS_AGENTS": AGENTS_MODULE,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(modules)]),
        }
    )
    started: list[ManagedProcess] = []

    def start(kind: str, name: str, *, cwd: Path | None = None) -> ManagedProcess:
        workdir = cwd or tmp_path / name
        workdir.mkdir(exist_ok=True)
        log_path = tmp_path / f"{name}.log"
        process: ManagedProcess
        if kind == "worker":
            process = WorkerProcess(name, env=env, log_path=log_path, concurrency=2, cwd=workdir)
        else:
            process = BeatProcess(
                name, env=env, log_path=log_path, schedule_path=workdir / "beat-schedule", cwd=workdir
            )
        process.start()
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.terminate()


@pytest.fixture
def client(migrated_pg_url: str, batch_redis_url: str) -> Iterator[Any]:
    from threads_celery.client.threads import Threads

    threads = Threads(database_url=migrated_pg_url, broker_url=batch_redis_url)
    try:
        yield threads
    finally:
        threads.close()


def runs_by_slot(client: Any, schedule: str) -> dict[str, Any]:
    """The schedule's runs, by the slot recorded with each (counted by run id prefix)."""
    found = [r for r in client.runs(limit=10_000) if r.id.startswith(f"sched:{schedule}:")]
    by_slot: dict[str, Any] = {}
    for run in found:
        slot = (run.input_meta or {}).get("slot")
        assert slot not in by_slot, f"two runs for slot {slot}: {by_slot[slot].id} and {run.id}"
        by_slot[slot] = run
    return by_slot


def all_completed(client: Any, schedule: str, slots: set[str]) -> dict[str, Any] | None:
    by_slot = runs_by_slot(client, schedule)
    if set(by_slot) >= slots and all(r.status == "completed" for r in by_slot.values()):
        return by_slot
    return None


def progress(client: Any, schedule: str, slots: set[str]) -> Callable[[], dict[str, Any]]:
    """What is missing, for a failure message: slots without a run, and unfinished runs."""

    def describe() -> dict[str, Any]:
        by_slot = runs_by_slot(client, schedule)
        return {
            "slots without a run": sorted(slots - set(by_slot)),
            "unfinished": {s: r.status for s, r in by_slot.items() if r.status != "completed"},
        }

    return describe


def test_two_beats_start_one_run_per_slot_and_a_restarted_beat_applies_the_missed_policy(
    services: Callable[..., ManagedProcess], client: Any, tmp_path: Path
) -> None:
    worker = services("worker", "w-batch")
    worker.wait_ready()
    beat_a, beat_b = services("beat", "beat-a"), services("beat", "beat-b")

    # Both Beats publish the same slots: wait until at least three slots came from both.
    def shared_slots() -> set[str]:
        return set(published(beat_a, "it-tick")) & set(published(beat_b, "it-tick"))

    eventually(lambda: len(shared_slots()) >= 3, what="both Beats publishing the same three slots")
    beat_a.terminate()
    beat_b.terminate()
    tick_logged = set(published(beat_a, "it-tick")) | set(published(beat_b, "it-tick"))
    acc_logged = set(published(beat_a, "it-acc")) | set(published(beat_b, "it-acc"))
    tick_slots = surely_sent(beat_a, "it-tick") | surely_sent(beat_b, "it-tick")
    acc_slots = surely_sent(beat_a, "it-acc") | surely_sent(beat_b, "it-acc")

    # Every published slot became exactly one completed run, and no run came from elsewhere.
    ticks = eventually(
        lambda: all_completed(client, "it-tick", tick_slots),
        what="the it-tick runs completing",
        detail=progress(client, "it-tick", tick_slots),
    )
    assert tick_slots <= set(ticks) <= tick_logged
    tick_slots = set(ticks)
    for run in ticks.values():
        assert run.output == "tick done"
        assert run.thread_id == run.id  # thread="new": the slot's own thread
        assert [m.role for m in client.messages(run.thread_id)] == ["user", "assistant"]
    accs = eventually(
        lambda: all_completed(client, "it-acc", acc_slots),
        what="the it-acc runs completing",
        detail=progress(client, "it-acc", acc_slots),
    )
    assert acc_slots <= set(accs) <= acc_logged
    acc_slots = set(accs)
    assert {r.thread_id for r in accs.values()} == {"sched:it-acc"}
    user_texts = [m.text for m in client.messages("sched:it-acc") if m.role == "user"]
    assert user_texts == ["tock"] * len(acc_slots)  # one user message per run, none twice
    # The duplicates really were delivered, and the ledger refused them.
    exists = worker.wait_for_log(r"succeeded in [\d.e-]+s: 'exists sched:it-tick:\d{8}T\d{6}Z'", timeout=WAIT_S)
    assert exists

    # Restart Beat A on its schedule file after a gap of a few slots.
    last_tick = max(tick_logged)
    time.sleep(3.5)  # the outage being simulated: Beat is down for more than one interval
    restarted = services("beat", "beat-a2", cwd=tmp_path / "beat-a")
    restarted.wait_for_log(r"slots were missed since .*skipping them \(missed='skip'\)", timeout=WAIT_S)
    catch_up = restarted.wait_for_log(r"schedule it-acc: publishing slot (\S+) \(after a gap", timeout=WAIT_S)
    eventually(lambda: len(published(restarted, "it-tick")) >= 2, what="the restarted Beat publishing again")
    restarted.terminate()

    after_restart = published(restarted, "it-tick")
    owed = tick_slots | surely_sent(restarted, "it-tick")
    ticks = eventually(
        lambda: all_completed(client, "it-tick", owed),
        what="the new it-tick runs",
        detail=progress(client, "it-tick", owed),
    )
    # skip: the slots of the outage (and the tick that found the gap) have no run.
    assert owed <= set(ticks) <= tick_logged | set(after_restart)
    assert min(after_restart) > last_tick
    gap = [s for s in ticks if last_tick < s < min(after_restart)]
    assert gap == []
    first_tick_line = next(line for line in restarted.log_text().splitlines() if "schedule it-tick:" in line)
    assert "skipping them" in first_tick_line  # the tick that found the gap published nothing
    # run_once: one run, for the latest missed slot, published on the first tick after the gap.
    accs = eventually(
        lambda: all_completed(client, "it-acc", acc_slots | {catch_up.group(1)}),
        what="the catch-up run",
        detail=progress(client, "it-acc", acc_slots | {catch_up.group(1)}),
    )
    assert catch_up.group(1) in accs
    assert catch_up.group(1) not in acc_slots
