"""Fixtures for the chaos tests: real worker and Beat processes that the tests kill, on a
PostgreSQL and a Redis of the session's own.

The chaos suite never touches the machine's services: the session starts a private PostgreSQL
cluster (``initdb``) and a private ``redis-server`` on free loopback ports
(:class:`tests.support.private_services.PrivatePostgres`, :class:`~tests.support.private_services.PrivateRedis`),
which tests may stop, crash and start again. Every module gets its own database on that server
(migrated), the Redis database flushed, its own side-effect ledger file and its own log directory.
A module sets the runtime settings its processes run with in a module-level ``CHAOS_ENV`` dict
(``THREADS_TOOL_LEASE_S`` and friends); :data:`DEFAULT_CHAOS_ENV` gives 2 s leases, a 2 s grace
before an unpublished step counts as lost and a 0.5 s reconcile interval. The broker's visibility
timeout stays at its default (3600 s), so a recovery seen within seconds cannot have come from
the broker redelivering an unacked message: it comes from the reconcile backbone, which is always
a real ``celery -A tasks beat`` process (never a ticker in the test process).

Processes are started in their own session (process group) through :mod:`tests.support.processes`
and always SIGKILLed as a group at teardown, even when a test fails; a failing test prints the
tail of every process log.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.effect_ledger import Ledger
from tests.support.private_services import PrivatePostgres, PrivateRedis
from tests.support.processes import (
    BeatProcess,
    ManagedProcess,
    WorkerProcess,
    exit_cleanly_on_sigterm,
    started_processes,
    subprocess_env,
)
from tests.support.services import require_service
from tests.support.waiting import eventually

__all__ = ["BeatProcess", "ChaosCluster", "ChaosServices", "WorkerProcess"]

CHAOS_AGENTS = "tests.chaos.chaos_agents"

DEFAULT_CHAOS_ENV: dict[str, str] = {
    "THREADS_TOOL_LEASE_S": "2",
    "THREADS_STEP_LEASE_S": "2",
    "THREADS_OUTBOX_STALE_AFTER_S": "2",
    "THREADS_RECONCILE_INTERVAL_S": "0.5",
    # The broker's visibility timeout keeps its default (3600 s): recovery must come from the
    # reconcile backbone, never from Redis handing an unacked message to someone else.
}

_names = itertools.count(1)
RECONCILE_RESULT = re.compile(r"threads\.reconcile\[[^\]]+\] succeeded in [\d.e-]+s: '(\{.*\})'$", re.MULTILINE)
# The task's shadow name holds its tool or agent: "threads.tool send_email[<key>]".
FENCE_REFUSED = re.compile(r"threads\.(?:tool|step)(?: [^\[\s]+)?\[([^\]]+)\] succeeded in [\d.e-]+s: 'fence lost'")


# -- the cluster --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChaosServices:
    """The session's own PostgreSQL and Redis: tests may stop and start them."""

    postgres: PrivatePostgres
    redis: PrivateRedis


class ChaosCluster:
    """One module's database, broker, ledger, processes and client."""

    def __init__(
        self,
        *,
        database_url: str,
        broker_url: str,
        directory: Path,
        settings_env: dict[str, str],
        services: ChaosServices | None = None,
    ) -> None:
        self.database_url = database_url
        self.broker_url = broker_url
        self.directory = directory
        self.settings_env = dict(settings_env)
        self.services = services
        self.ledger = Ledger(directory / "ledger.jsonl")
        self.marker_dir = directory / "crash-markers"
        self.marker_dir.mkdir(exist_ok=True)
        self.processes: list[ManagedProcess] = []
        self._threads: Any = None

    # -- environment --------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = subprocess_env(drop_prefixes=("THREADS_", "CHAOS_", "CELERY_"))
        env.update(
            THREADS_DATABASE_URL=self.database_url,
            THREADS_BROKER_URL=self.broker_url,
            THREADS_AGENTS=CHAOS_AGENTS,
            CHAOS_LEDGER=str(self.ledger.path),
            CHAOS_CRASH_MARKER_DIR=str(self.marker_dir),
        )
        env.update(self.settings_env)
        env.update(extra)
        return env

    # -- processes ----------------------------------------------------------------------------

    def start_worker(
        self, name: str | None = None, *, wait: bool = True, concurrency: int = 2, **env: str
    ) -> WorkerProcess:
        name = name or f"chaos{next(_names)}"
        worker = WorkerProcess(
            name,
            env=self.env(CHAOS_ROLE="worker", **env),
            log_path=self.directory / f"{name}.log",
            concurrency=concurrency,
        )
        worker.start()
        self.processes.append(worker)
        return worker.wait_ready() if wait else worker

    def start_workers(self, count: int, **env: str) -> list[WorkerProcess]:
        """Start ``count`` workers at once and wait until all are ready."""
        workers = [self.start_worker(wait=False, **env) for _ in range(count)]
        for worker in workers:
            worker.wait_ready()
        return workers

    def start_beat(self, name: str | None = None, *, wait: bool = True, **env: str) -> BeatProcess:
        """A real ``celery -A tasks beat``: the reconcile backbone, every THREADS_RECONCILE_INTERVAL_S."""
        name = name or f"beat{next(_names)}"
        beat = BeatProcess(
            name,
            env=self.env(**env),
            log_path=self.directory / f"{name}.log",
            schedule_path=self.directory / f"{name}-schedule",
        )
        beat.start()
        self.processes.append(beat)
        return beat.wait_ready() if wait else beat

    def worker_running(self, pid: int, workers: list[WorkerProcess]) -> WorkerProcess:
        """The worker whose pool process ``pid`` is."""
        for worker in workers:
            if worker.owns(pid):
                return worker
        raise AssertionError(f"pid {pid} belongs to none of {workers}")

    def workers(self) -> list[WorkerProcess]:
        """Every worker this cluster started, dead or alive."""
        return [p for p in self.processes if isinstance(p, WorkerProcess)]

    def close(self) -> None:
        for process in self.processes:
            process.kill()
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    # -- what the backbone did, from the workers' logs ----------------------------------------

    def backbone_totals(self) -> Counter[str]:
        """The sum of every reconcile tick's counts (``expired_runs``, ``republished``, ...) that
        a worker of this cluster ran, read from the workers' logs (ticks come from Beat)."""
        totals: Counter[str] = Counter()
        for worker in self.workers():
            for found in RECONCILE_RESULT.finditer(worker.log_text()):
                counts = ast.literal_eval(found.group(1).replace("\\'", "'"))
                totals.update({k: int(v) for k, v in counts.items()})
            totals["ticks"] += len(RECONCILE_RESULT.findall(worker.log_text()))
        return totals

    def fence_refusals(self) -> list[str]:
        """Task ids (effect keys or step keys) whose late commit a fence refused, in every worker log."""
        return [m.group(1) for w in self.workers() for m in FENCE_REFUSED.finditer(w.log_text())]

    # -- the client ---------------------------------------------------------------------------

    @property
    def threads(self) -> Any:
        """A ``Threads`` client with the same settings as the workers, the chaos agents registered."""
        if self._threads is None:
            from tests.chaos import chaos_agents
            from threads_celery import Settings, Threads

            settings = Settings.from_env(env=self.env())
            self._threads = Threads(self.database_url, self.broker_url, settings=settings)
            for agent in chaos_agents.all_agents():
                self._threads.register(agent)
        return self._threads

    # -- reading the ledger and the store ---------------------------------------------------

    def get_run(self, run_id: str) -> Any:
        """The run, retrying while the store is unreachable (a test may be restarting it)."""
        from threads_celery.exceptions import StoreUnavailable

        def load() -> Any:
            try:
                return self.threads.get_run(run_id)
            except StoreUnavailable:
                return None

        return eventually(load, timeout=60, what=f"reading run {run_id} from the store")

    def wait_settled(self, run_id: str, timeout: float = 30.0) -> Any:
        """Wait until the run ended or waits for a person; AssertionError after ``timeout``."""
        from threads_celery.client.threads import NEEDS_A_PERSON
        from threads_celery.records import TERMINAL_STATUSES

        def settled() -> Any:
            run = self.get_run(run_id)
            return run if run.status in TERMINAL_STATUSES or run.status in NEEDS_A_PERSON else None

        return eventually(
            settled,
            timeout=timeout,
            what=f"run {run_id} settling",
            detail=lambda: self.get_run(run_id).status,
            interval=0.05,
        )

    def wait_status(self, run_id: str, status: str, timeout: float = 30.0) -> Any:
        run = self.wait_settled(run_id, timeout)
        assert run.status == status, f"run {run_id} is {run.status}, expected {status} (error: {run.error})"
        return run

    def call(self, effect_key: str) -> Any:
        with self.threads.store.read() as tx:
            loaded = tx.get_call_and_run(effect_key)
        assert loaded is not None, f"no call {effect_key}"
        return loaded[0]

    def tool_results(self, thread_id: str, call_id: str | None = None) -> list[Any]:
        """The thread's tool-result messages (for one model call id, if given)."""
        return [
            m.tool_result
            for m in self.threads.messages(thread_id)
            if m.role == "tool" and m.tool_result is not None and (call_id is None or m.tool_result.call_id == call_id)
        ]

    def outbox_keys(self) -> list[str]:
        with self.threads.store.read() as tx:
            return tx.outbox_keys()


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chaos_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosServices]:
    """A PostgreSQL cluster and a redis-server of this session's own, on free loopback ports.

    Missing ``initdb``/``postgres`` or ``redis-server`` skips locally and fails under CI.
    """
    for name, reason in (
        ("PostgreSQL (initdb)", PrivatePostgres.available()),
        ("redis-server", PrivateRedis.available()),
    ):
        require_service(name, reason is None, reason or "", address="a private instance")
    exit_cleanly_on_sigterm()  # a killed session must not leave its servers running
    logs = tmp_path_factory.mktemp("chaos-services")
    postgres = PrivatePostgres(log_dir=logs)
    redis_server = PrivateRedis(log_dir=logs)
    try:
        postgres.init()
        redis_server.start()
        yield ChaosServices(postgres, redis_server)
    finally:
        redis_server.destroy()
        postgres.destroy()


@pytest.fixture(scope="module")
def chaos_broker_url(chaos_services: ChaosServices) -> Iterator[str]:
    """The private Redis, flushed for this module (and again after it)."""
    import redis

    services = chaos_services
    if not services.redis.answers():  # a previous module left it down: bring it back
        services.redis.start()
    url = services.redis.url(0)
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.flushdb()
        yield url
        with contextlib.suppress(redis.RedisError):
            client.flushdb()
    finally:
        client.close()


@pytest.fixture(scope="module")
def chaos_database_url(chaos_services: ChaosServices) -> str:
    """A fresh database on the private PostgreSQL, migrated to head."""
    from threads_celery.store import create_store_engine, parse_database_url
    from threads_celery.store.migrate import upgrade

    if not chaos_services.postgres.accepts_connections():  # a previous module left it down
        chaos_services.postgres.start()
    url = chaos_services.postgres.create_database(f"chaos_{uuid.uuid4().hex[:12]}")
    engine = create_store_engine(parse_database_url(url))
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest,
    chaos_services: ChaosServices,
    chaos_database_url: str,
    chaos_broker_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChaosCluster]:
    """The module's chaos cluster; every process it started is SIGKILLed at the end."""
    settings_env = {**DEFAULT_CHAOS_ENV, **getattr(request.module, "CHAOS_ENV", {})}
    directory = tmp_path_factory.mktemp(f"chaos-{request.module.__name__.rpartition('.')[2]}")
    chaos = ChaosCluster(
        database_url=chaos_database_url,
        broker_url=chaos_broker_url,
        directory=directory,
        settings_env=settings_env,
        services=chaos_services,
    )
    try:
        yield chaos
    finally:
        chaos.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.chaos_failed = True  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _print_process_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """When a chaos test fails, print the tail of every process log written during the test."""
    began = time.time()
    yield
    if not getattr(request.node, "chaos_failed", False):
        return
    for process in started_processes():
        try:
            if process.log_path.stat().st_mtime < began - 1:
                continue
        except FileNotFoundError:
            continue
        print(f"\n===== {process!r}: {process.log_path} (last 150 lines) =====")
        print(process.log_tail(150))
