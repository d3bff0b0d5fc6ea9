"""A worker or Beat started while PostgreSQL is away waits for it, for a bounded time.

The PostgreSQL here is the test's own (tests/support/own_postgres.py), migrated, then stopped:
the worker (``threads-celery worker``) and Beat (``celery -A tasks beat``) start against it,
say they are waiting, and start for real once the server is started a few seconds later; a run
then completes through them. What waiting cannot fix (a database that does not exist) is still
refused at once, and a server that never comes back is refused once the wait is over: see
tests/integration/test_fail_fast.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import agents_for_tests
from tests.support.own_postgres import OwnPostgres, own_postgres
from tests.support.processes import BeatProcess, WorkerProcess, subprocess_env
from threads_celery import Threads
from threads_celery.store import create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade

WAITING = r"cannot reach the database at .*; trying again in"


@pytest.fixture
def stopped_ledger() -> Iterator[tuple[OwnPostgres, str]]:
    """A migrated database on a server of the test's own, the server stopped."""
    with own_postgres() as server:
        url = server.create_database("ledger")
        engine = create_store_engine(parse_database_url(url))
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        server.stop()
        yield server, url


def test_a_worker_and_beat_wait_for_a_database_that_comes_back(
    stopped_ledger: tuple[OwnPostgres, str], integration_redis_url: str, tmp_path: Path
) -> None:
    server, url = stopped_ledger
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": agents_for_tests.__name__,
            "THREADS_DATABASE_STARTUP_WAIT_S": "120",
            "THREADS_RECONCILE_INTERVAL_S": "1",
        }
    )
    worker = WorkerProcess("waiter", env=env, log_path=tmp_path / "worker.log", concurrency=1, cli=True)
    beat = BeatProcess("beat", env=env, log_path=tmp_path / "beat.log", schedule_path=tmp_path / "schedule")
    with worker, beat:
        worker.start()
        beat.start()
        worker.wait_for_log(WAITING, timeout=60, what="the worker waiting for the database")
        beat.wait_for_log(WAITING, timeout=60, what="Beat waiting for the database")
        assert " ready." not in worker.log_text()
        server.start()
        worker.wait_ready(timeout=90)
        beat.wait_ready(timeout=90)
        assert "cannot start" not in worker.log_text() + beat.log_text()
        client = Threads(database_url=url, broker_url=integration_redis_url)
        try:
            client.register(agents_for_tests.one_step)
            run = client.wait(client.start(agents_for_tests.one_step, "hello").run_id, 60)
        finally:
            client.close()
        assert run.status == "completed", run
        worker.terminate()
        beat.terminate()
