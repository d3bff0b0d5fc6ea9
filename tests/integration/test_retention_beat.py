"""The retention sweep as a deployment runs it: a real ``celery beat`` publishes it, a real
prefork worker sweeps in bounded batches on the control queue, on PostgreSQL and Redis.

Succeeded threads are kept 20 seconds (a policy in ``THREADS_RETENTION``), and Beat starts a
sweep every second. Expired threads must go, batch by batch (two threads per batch), while a
held thread and a thread whose run waits for an approval stay; later sweeps then change nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tests.integration import history_agents
from tests.support.clients import registered_client
from tests.support.processes import BeatProcess, WorkerProcess, subprocess_env
from tests.support.waiting import eventually

KEEP_S = 20.0
POLICY = {"rules": [{"status": "succeeded", "keep_days": KEEP_S / 86400}], "batch_size": 2}


@pytest.fixture(scope="module")
def processes(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, BeatProcess]]:
    logs = tmp_path_factory.mktemp("retention")
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "tests.integration.history_agents",
            "THREADS_SECRET_KEY": history_agents.FERNET_KEY,
            "THREADS_RETENTION": json.dumps(POLICY),
            "THREADS_RETENTION_INTERVAL_S": "1",
        }
    )
    worker = WorkerProcess("ret", env=env, log_path=logs / "worker.log", concurrency=2)
    beat = BeatProcess("ret-beat", env=env, log_path=logs / "beat.log", schedule_path=logs / "beat-schedule", cwd=logs)
    with worker.running():
        beat.start()
        try:
            beat.wait_ready()
            yield worker, beat
        finally:
            beat.terminate()


def _threads_left(pg: str, ids: list[str]) -> set[str]:
    from threads_celery.store import create_store_engine, parse_database_url

    engine = create_store_engine(parse_database_url(pg))
    try:
        with engine.connect() as conn:
            return set(conn.execute(text("SELECT id FROM threads WHERE id = ANY(:ids)"), {"ids": ids}).scalars())
    finally:
        engine.dispose()


def _batches(worker: WorkerProcess) -> list[str]:
    return re.findall(r"retention sweep batch: (examined \d+, due \d+, pruned \d+)", worker.log_text())


def test_beat_sweeps_expired_threads_in_batches_and_keeps_held_and_running_ones(
    processes: tuple[WorkerProcess, BeatProcess],
    migrated_pg_url: str,
    integration_redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, beat = processes
    monkeypatch.setenv("THREADS_SECRET_KEY", history_agents.FERNET_KEY)
    with registered_client(migrated_pg_url, integration_redis_url, history_agents.ALL_AGENTS) as client:
        env = {"API_TOKEN": history_agents.SECRET_VALUE, "CITY": "Porto"}
        handles = [client.start("hist_tools", "look", thread_id=f"ret-{i}", env=env) for i in range(5)]
        for handle in handles:
            assert client.wait(handle.run_id, timeout=KEEP_S).status == "completed"
        held = handles[0].thread_id
        client.hold(held, reason="legal hold", held_by="dpo")
        waiting = client.start("hist_asks", "send", thread_id="ret-waiting")
        assert client.wait(waiting.run_id, timeout=KEEP_S).status == "awaiting_approval"
        doomed = [h.thread_id for h in handles[1:]]
        every = [held, waiting.thread_id, *doomed]
        assert _threads_left(migrated_pg_url, every) == set(every)  # nothing is due yet

        eventually(
            lambda: not (_threads_left(migrated_pg_url, every) & set(doomed)),
            timeout=KEEP_S + 60,
            what="the expired threads pruned by Beat's sweep",
            detail=lambda: (_threads_left(migrated_pg_url, every), _batches(worker)[-5:], worker.log_tail(20)),
        )
        assert _threads_left(migrated_pg_url, every) == {held, waiting.thread_id}
        assert re.search(r"Sending due task threads-retention", beat.log_text())
        batches = _batches(worker)
        assert any(b.startswith("examined 2,") for b in batches)  # full batches, each publishing the next
        pruned = sum(int(b.rsplit(" ", 1)[1]) for b in batches)
        assert pruned == len(doomed)

        # Later sweeps find nothing to do, and keep what they kept.
        seen = len(batches)
        eventually(lambda: len(_batches(worker)) >= seen + 4, timeout=60, what="four more sweep batches")
        assert all(b.endswith("pruned 0") for b in _batches(worker)[seen:])
        assert _threads_left(migrated_pg_url, every) == {held, waiting.thread_id}
        assert client.get_run(waiting.run_id).status == "awaiting_approval"
