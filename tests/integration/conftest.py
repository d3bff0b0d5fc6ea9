"""Fixtures for integration tests: a migrated PostgreSQL ledger and a real worker subprocess.

``worker`` (module scope) starts ``celery -A tasks worker --pool prefork`` against a fresh,
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
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_AGENTS = "tests.integration.agents_for_tests"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass
class WorkerProcess:
    """A ``celery -A tasks worker`` subprocess in its own process group, logging to a file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    database_url: str
    broker_url: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 100) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_log(self, pattern: str, *, timeout: float = 30.0) -> re.Match[str]:
        """Poll the log until the regex ``pattern`` matches; AssertionError after ``timeout``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.log_text())
            if found:
                return found
            if not self.alive():
                raise AssertionError(f"worker exited while waiting for {pattern!r}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not in the worker log within {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.wait_for_log(rf"{re.escape(self.name)}@\S+ ready\.", timeout=timeout)

    def terminate(self) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL the whole group after a deadline."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the pool's children too, whatever happened
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process we cannot reap
            pass


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
    name = "w1"
    log_path = tmp_path_factory.mktemp("worker") / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADS_", "CELERY_"))}
    env.update(
        THREADS_DATABASE_URL=migrated_pg_url,
        THREADS_BROKER_URL=integration_redis_url,
        THREADS_AGENTS=worker_agents,
        PYTHONPATH=str(REPO_ROOT),
        PYTHONUNBUFFERED="1",
    )
    argv = [
        sys.executable, "-m", "celery", "-A", "tasks", "worker",
        "--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO",
        "-n", f"{name}@%h", "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process = WorkerProcess(name, proc, log_path, migrated_pg_url, integration_redis_url)
    try:
        process.wait_ready()
        yield process
    finally:
        process.terminate()


@pytest.fixture(scope="module")
def threads(worker: WorkerProcess) -> Iterator[Any]:
    """A client on the worker's ledger and broker, with the test agents registered."""
    from tests.integration import agents_for_tests
    from threads_celery import Threads

    client = Threads(database_url=worker.database_url, broker_url=worker.broker_url)
    try:
        for agent in agents_for_tests.ALL_AGENTS:
            client.register(agent)
        yield client
    finally:
        client.close()


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
