"""The backbone does not wait behind work: reconcile ticks overtake a backlog of 10,000 tasks.

A real prefork worker (``celery -A tasks worker``, no ``-Q``) and a real Beat on Redis and
PostgreSQL. Before the worker starts, 10,000 ``threads.step`` messages are queued on the work
queue (steps of runs that do not exist: each one reads the ledger and does nothing, as a
duplicate delivery does). Beat ticks every 0.5 s. While most of the backlog is still queued:

- a lost outbox row is republished (the tick's work is done, not merely its message received);
- every tick Beat published ran, except at most the one in flight: ticks keep Beat's pace, i.e.
  each runs within about one interval, instead of waiting behind the 10,000 tasks;
- no tick was skipped as covered or discarded as expired.

Before the control queue existed, ticks shared the work queue and expired after two intervals:
none of them ran until the backlog had drained.

Ticks no longer expire; a pile of late ticks (after an outage) is handled by running one and
skipping, as covered, those published before a tick that already ran in the same process.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from tests.support.processes import BeatProcess, WorkerProcess, queued_messages, subprocess_env
from tests.support.waiting import eventually
from threads_celery.decisions.backbone import RECONCILE_TASK, WORK_PRIORITY, WORK_QUEUE, message_priority
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.store.schema import outbox
from threads_celery.transitions.publishing import open_store
from threads_celery.transitions.runs import STEP_TASK, utcnow
from threads_celery.worker.application import create_app

BACKLOG = 10_000
INTERVAL_S = 0.5
TICKS_TO_SEE = 4
PILE = 6
# An idle tick logs at DEBUG only (threads_celery.worker.quiet_ticks): these tests count every one.
TICK_LOGS = ["--loglevel", "DEBUG"]
TICK_OUTCOME = re.compile(r"threads\.reconcile\[[^\]]+\] succeeded in [\d.e-]+s: '(\{|covered by a later tick)")
TEST_AGENTS = "tests.integration.agents_for_tests"

pytestmark = pytest.mark.integration


@pytest.fixture
def env(migrated_pg_url: str, integration_redis_url: str) -> dict[str, str]:
    return subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": TEST_AGENTS,
            "THREADS_RECONCILE_INTERVAL_S": str(INTERVAL_S),
        }
    )


@pytest.fixture
def broker(integration_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(integration_redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def queue_backlog(broker_url: str, count: int) -> None:
    """Publish ``count`` work messages with the queue and priority the runtime gives work (as
    :class:`threads_celery.transitions.publishing.Publisher` does), through one connection, as a burst would."""
    app = create_app(Settings(), AgentRegistry(), broker_url=broker_url)
    priority = message_priority(STEP_TASK, recovered=False, broker_url=broker_url)
    assert priority == WORK_PRIORITY
    with app.producer_or_acquire() as producer:
        for i in range(count):
            run_id = f"run_backlog_{i}"
            app.send_task(
                STEP_TASK,
                args=(run_id, 0),
                task_id=f"step:{run_id}:0",
                priority=priority,
                producer=producer,
            )


def ticks_run(worker: WorkerProcess) -> int:
    return len(re.findall(r"threads\.reconcile\[[^\]]+\] succeeded in [\d.e-]+s: '\{", worker.log_text()))


def test_ticks_keep_beats_pace_behind_ten_thousand_queued_tasks(
    env: dict[str, str],
    broker: redis.Redis,
    migrated_pg_url: str,
    integration_redis_url: str,
    tmp_path: Path,
) -> None:
    # A lost outbox row (its publish never happened): only a tick republishes it.
    store = open_store(migrated_pg_url)
    lost = OutboxEntry(key="step:run_lost:0", task=STEP_TASK, args=("run_lost", 0), argsrepr="(lost)")
    with store.transaction() as tx:
        tx.insert_outbox(lost, utcnow() - timedelta(hours=1))

    queue_backlog(integration_redis_url, BACKLOG)
    assert queued_messages(integration_redis_url, WORK_QUEUE) == BACKLOG

    worker = WorkerProcess("backlog", env=env, log_path=tmp_path / "worker.log", concurrency=2, extra_args=TICK_LOGS)
    beat = BeatProcess("beat", env=env, log_path=tmp_path / "beat.log", schedule_path=tmp_path / "beat-schedule")
    try:
        worker.start()
        worker.wait_ready()
        beat.start()

        def republished() -> bool:
            with store.read() as tx:
                count = tx.conn.execute(select(outbox.c.publish_count).where(outbox.c.key == lost.key)).scalar()
            return bool(count)

        eventually(
            republished,
            timeout=60,
            what="the lost outbox row republished by a tick",
            detail=worker.log_tail,
        )
        eventually(lambda: ticks_run(worker) >= TICKS_TO_SEE, timeout=60, what=f"{TICKS_TO_SEE} ticks run")
        # Read Beat's count first: a tick it sends after this read cannot inflate ``ran``.
        sent = beat.ticks_sent()
        ran = ticks_run(worker)
        remaining = queued_messages(integration_redis_url, WORK_QUEUE)
        print(f"\nticks sent {sent}, run {ran}, work still queued {remaining} of {BACKLOG}")
        assert remaining >= BACKLOG // 2, f"the backlog drained first ({remaining} left): the ticks waited behind it"
        assert ran >= sent - 1, f"Beat sent {sent} ticks, only {ran} ran: ticks wait behind the work"
        log = worker.log_text()
        assert "covered by a later tick" not in log  # on time, so none was skipped
        assert "Discarding revoked task: threads.reconcile" not in log  # and none expired
    finally:
        beat.kill()
        worker.kill()
        store.engine.dispose()


def test_a_pile_of_late_ticks_costs_one_real_tick_per_worker_process(
    env: dict[str, str], broker: redis.Redis, integration_redis_url: str, tmp_path: Path
) -> None:
    # Ticks that piled up while no worker consumed the control queue (an outage): each says it
    # was published a minute ago, as Beat stamps it.
    app = create_app(Settings(), AgentRegistry(), broker_url=integration_redis_url)
    published_at = time.time() - 60
    for _ in range(PILE):
        app.tasks[RECONCILE_TASK].apply_async(kwargs={"published_at": published_at})

    worker = WorkerProcess("pile", env=env, log_path=tmp_path / "worker.log", concurrency=2, extra_args=TICK_LOGS)
    try:
        worker.start()
        worker.wait_ready()
        outcomes = eventually(
            lambda: (found := TICK_OUTCOME.findall(worker.log_text())) and len(found) == PILE and found,
            timeout=60,
            what=f"all {PILE} ticks handled",
            detail=worker.log_tail,
        )
    finally:
        worker.kill()
    real = [o for o in outcomes if o.startswith("{")]
    covered = [o for o in outcomes if o == "covered by a later tick"]
    # None is discarded unseen, and the pile costs at most one real tick per pool process.
    assert len(real) + len(covered) == PILE
    assert 1 <= len(real) <= 2, outcomes
