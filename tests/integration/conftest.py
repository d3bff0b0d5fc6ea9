"""Fixtures for integration tests: a migrated PostgreSQL ledger and a real worker subprocess.

``worker`` (module scope) starts ``celery -A tasks worker --pool prefork`` (through
:mod:`tests.support.processes`, where every test process is started) against a fresh,
migrated PostgreSQL database and a Redis database of its own, loading the agents of
:mod:`tests.integration.agents_for_tests`; ``threads`` is a client for the same ledger and broker
with those agents registered. A failing test prints the tail of the worker's log.

The worker's Redis database is ``THREADS_TEST_INTEGRATION_REDIS_DB`` (default 11) on the server
``redis_url`` points at, flushed when the module starts: a worker of another suite (or of another
developer's run) on the shared test database would otherwise take these tasks, find no such run
in its own ledger and drop them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.clients import registered_client
from tests.support.processes import REPO_ROOT, WorkerProcess, subprocess_env

__all__ = ["REPO_ROOT", "TEST_AGENTS", "WorkerProcess"]  # what the integration modules import from here

TEST_AGENTS = "tests.integration.agents_for_tests"
READY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def integration_redis_url(redis_url: str) -> str:
    """A Redis database for this module's worker alone, flushed now."""
    import redis

    raw_db = os.environ.get("THREADS_TEST_INTEGRATION_REDIS_DB", "11")
    if not raw_db.isdigit() or not 1 <= int(raw_db) <= 15:
        pytest.fail(f"THREADS_TEST_INTEGRATION_REDIS_DB must be an integer in 1..15, got {raw_db!r}")
    parts = urlsplit(redis_url)
    client = redis.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=int(raw_db))
    try:
        client.flushdb()
    finally:
        client.close()
    return f"redis://{parts.hostname}:{parts.port}/{raw_db}"


@pytest.fixture(scope="module")
def migrated_pg_url(pg_url_module: str) -> str:
    """The module's PostgreSQL database with every migration applied."""
    from threads_celery.store import create_store_engine, parse_database_url
    from threads_celery.store.migrate import upgrade

    engine = create_store_engine(parse_database_url(pg_url_module))
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return pg_url_module


@pytest.fixture(scope="module")
def worker_agents() -> str:
    """The agent modules the module's worker loads (THREADS_AGENTS); a test module may override it."""
    return TEST_AGENTS


@pytest.fixture(scope="module")
def worker(
    migrated_pg_url: str,
    integration_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    worker_agents: str,
) -> Iterator[WorkerProcess]:
    """A real prefork worker (2 processes) running the test agents; stopped at module end."""
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": worker_agents,
        }
    )
    process = WorkerProcess("w1", env=env, log_path=tmp_path_factory.mktemp("worker") / "w1.log", concurrency=2)
    with process.running(READY_TIMEOUT_S):
        yield process


@pytest.fixture(scope="module")
def threads(worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str) -> Iterator[Any]:
    """A client on the worker's ledger and broker, with the test agents registered."""
    from tests.integration import agents_for_tests

    with registered_client(migrated_pg_url, integration_redis_url, agents_for_tests.ALL_AGENTS) as client:
        yield client


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"_report_{report.when}", report)


@pytest.fixture(autouse=True)
def _print_worker_log_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "worker" not in request.fixturenames:
        return
    report = getattr(request.node, "_report_call", None)
    if report is not None and report.failed:
        process: WorkerProcess = request.getfixturevalue("worker")
        print(f"--- last lines of the worker log ({process.log_path}) ---\n{process.log_tail()}")
