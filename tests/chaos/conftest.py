"""Fixtures for the chaos tests: real worker and Beat processes that the tests kill.

Every module gets its own PostgreSQL database (migrated), its own Redis database number
(``THREADS_TEST_CHAOS_REDIS_DB``, default 12, flushed at module start, so chaos workers never
consume another suite's messages), its own side-effect ledger file and its own log directory.
A module sets the runtime settings its processes run with in a module-level ``CHAOS_ENV`` dict
(``THREADS_TOOL_LEASE_S`` and friends); :data:`DEFAULT_CHAOS_ENV` gives 2 s leases, a 2 s grace
before an unpublished step counts as lost and a 0.5 s reconcile interval. The broker's visibility
timeout stays at its default (3600 s), so a recovery seen within seconds cannot have come from
the broker redelivering an unacked message.

Processes are started in their own session (process group) and always SIGKILLed as a group at
teardown, even when a test fails; a failing test prints the tail of every process log. A file
lock lets only one chaos module run at a time on a machine, across pytest sessions.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.chaos.effect_ledger import Ledger

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAOS_AGENTS = "tests.chaos.chaos_agents"

DEFAULT_CHAOS_ENV: dict[str, str] = {
    "THREADS_TOOL_LEASE_S": "2",
    "THREADS_STEP_LEASE_S": "2",
    "THREADS_OUTBOX_STALE_AFTER_S": "2",
    "THREADS_RECONCILE_INTERVAL_S": "0.5",
    # The broker's visibility timeout keeps its default (3600 s): recovery must come from the
    # reconcile backbone, never from Redis handing an unacked message to someone else.
}

_ALL_PROCESSES: list[ManagedProcess] = []
_names = itertools.count(1)


# -- processes --------------------------------------------------------------------------------


class ManagedProcess:
    """A subprocess in its own process group, logging to its own file."""

    kind = "process"

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    def start(self) -> ManagedProcess:
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill() takes the children too
            )
        finally:
            log.close()
        _ALL_PROCESSES.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_log(self, pattern: str, *, timeout: float, what: str | None = None) -> re.Match[str]:
        """Poll the log until ``pattern`` (a regex) matches; AssertionError after ``timeout``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.log_text())
            if found:
                return found
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{self.name}: {what or pattern!r} did not appear in its log within {timeout:g} s\n"
                    f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group (the process and every child) and reap it."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self.stopped = False
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass

    def stop(self) -> None:
        """SIGSTOP the whole group: it stays alive but runs nothing (its lease keeper too)."""
        self._signal_group(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        """SIGCONT the whole group."""
        self._signal_group(signal.SIGCONT)
        self.stopped = False

    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM (a warm shutdown for Celery), then SIGKILL the group if it lingers."""
        if self.proc is None:
            return
        if self.stopped:
            self.cont()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def __repr__(self) -> str:
        state = "alive" if self.alive() else "dead"
        return f"<{self.kind} {self.name} pid={self.proc.pid if self.proc else None} {state}>"


class WorkerProcess(ManagedProcess):
    """``celery -A tasks worker --pool prefork`` loading the chaos agents."""

    kind = "worker"

    def __init__(self, name: str, env: dict[str, str], log_path: Path, *, concurrency: int = 2) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", "tasks", "worker",
            "--pool", "prefork", "--concurrency", str(concurrency),
            "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "--loglevel", "INFO",
        ]  # fmt: skip
        super().__init__(name, argv, env, log_path)

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Wait until the worker logs that it is ready (and still runs)."""
        deadline = time.monotonic() + timeout
        pattern = re.compile(rf"{re.escape(self.name)}@\S+ ready\.")
        while True:
            if pattern.search(self.log_text()):
                return self
            if not self.alive():
                raise AssertionError(f"worker {self.name} exited before it was ready:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"worker {self.name} was not ready within {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def child_pids(self) -> list[int]:
        """The prefork pool's processes (children of the worker's main process)."""
        if not self.alive():
            return []
        pids: set[int] = set()
        task_dir = Path(f"/proc/{self.pid}/task")
        try:
            for children in task_dir.glob("*/children"):
                pids.update(int(p) for p in children.read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
        if not pids:  # kernels without /proc/<pid>/task/<tid>/children
            out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.pid)], capture_output=True, text=True)
            pids.update(int(p) for p in out.stdout.split())
        return sorted(pids)

    def owns(self, pid: int) -> bool:
        return pid in self.child_pids()

    def kill_child(self, pid: int | None = None) -> int:
        """SIGKILL one pool process (``pid`` must be one of ours); returns the pid killed."""
        children = self.child_pids()
        if pid is None:
            if not children:
                raise AssertionError(f"worker {self.name} has no pool process to kill")
            pid = children[0]
        elif pid not in children:
            raise AssertionError(f"pid {pid} is not a pool process of worker {self.name} ({children})")
        os.kill(pid, signal.SIGKILL)
        return pid


class BeatProcess(ManagedProcess):
    """``celery -A tasks beat``: schedules ``threads.reconcile`` every THREADS_RECONCILE_INTERVAL_S."""

    kind = "beat"

    def __init__(self, name: str, env: dict[str, str], log_path: Path, schedule_path: Path) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", "tasks", "beat",
            "-s", str(schedule_path), "--loglevel", "INFO",
        ]  # fmt: skip
        super().__init__(name, argv, env, log_path)

    def wait_ready(self, timeout: float = 60.0) -> BeatProcess:
        self.wait_for_log(r"beat: Starting", timeout=timeout, what="beat start-up")
        return self


def _kill_everything() -> None:
    for process in _ALL_PROCESSES:
        try:
            process.kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_kill_everything)


# -- the in-test reconcile ticker ---------------------------------------------------------------


class Ticker:
    """Calls ``Threads.reconcile()`` (one backbone tick) every ``interval`` seconds on a thread.

    Used where the point of a test is the recovery, not Beat itself; errors (a restarting
    database, an unreachable broker) are counted and the ticker keeps going, as Beat would.
    """

    def __init__(self, tick: Callable[[], Any], interval: float = 0.5) -> None:
        self._tick = tick
        self.interval = interval
        self.ticks = 0
        self.errors: list[str] = []
        self.totals = {"expired_runs": 0, "republished": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-ticker", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                result = self._tick()
                for key in self.totals:
                    self.totals[key] += int(result.get(key, 0)) if isinstance(result, dict) else 0
                self.ticks += 1
            except Exception as exc:  # noqa: BLE001 - a failed tick is retried next interval
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# -- the cluster --------------------------------------------------------------------------------


class ChaosCluster:
    """One module's database, broker, ledger, processes and client."""

    def __init__(self, *, database_url: str, broker_url: str, directory: Path, settings_env: dict[str, str]) -> None:
        self.database_url = database_url
        self.broker_url = broker_url
        self.directory = directory
        self.settings_env = dict(settings_env)
        self.ledger = Ledger(directory / "ledger.jsonl")
        self.marker_dir = directory / "crash-markers"
        self.marker_dir.mkdir(exist_ok=True)
        self.processes: list[ManagedProcess] = []
        self._threads: Any = None

    # -- environment --------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADS_", "CHAOS_", "CELERY_"))}
        env.update(
            THREADS_DATABASE_URL=self.database_url,
            THREADS_BROKER_URL=self.broker_url,
            THREADS_AGENTS=CHAOS_AGENTS,
            CHAOS_LEDGER=str(self.ledger.path),
            CHAOS_CRASH_MARKER_DIR=str(self.marker_dir),
            PYTHONPATH=str(REPO_ROOT),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.settings_env)
        env.update(extra)
        return env

    # -- processes ----------------------------------------------------------------------------

    def start_worker(self, name: str | None = None, *, wait: bool = True, **env: str) -> WorkerProcess:
        name = name or f"chaos{next(_names)}"
        worker = WorkerProcess(name, self.env(CHAOS_ROLE="worker", **env), self.directory / f"{name}.log")
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
        name = name or f"beat{next(_names)}"
        beat = BeatProcess(
            name, self.env(**env), self.directory / f"{name}.log", self.directory / f"{name}-schedule"
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

    def close(self) -> None:
        for process in self.processes:
            process.kill()
        if self._threads is not None:
            self._threads.close()
            self._threads = None

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

    def ticker(self, interval: float = 0.5) -> Ticker:
        return Ticker(self.threads.reconcile, interval)

    # -- reading the ledger and the store ---------------------------------------------------

    def get_run(self, run_id: str) -> Any:
        """The run, retrying while the store is unreachable (a test may be restarting it)."""
        from threads_celery.exceptions import StoreUnavailable

        deadline = time.monotonic() + 60
        while True:
            try:
                return self.threads.get_run(run_id)
            except StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def wait_settled(self, run_id: str, timeout: float = 30.0) -> Any:
        """Wait until the run ended or waits for a person; AssertionError after ``timeout``."""
        from threads_celery.client import NEEDS_A_PERSON
        from threads_celery.records import TERMINAL_STATUSES

        deadline = time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if run.status in TERMINAL_STATUSES or run.status in NEEDS_A_PERSON:
                return run
            if time.monotonic() >= deadline:
                raise AssertionError(f"run {run_id} is still {run.status} after {timeout:g} s")
            time.sleep(0.05)

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


LOCK_PATH = Path(os.environ.get("THREADS_TEST_CHAOS_LOCK", "/tmp/threads-celery-chaos.lock"))
LOCK_WAIT_S = 900.0


@pytest.fixture(scope="module")
def chaos_machine_lock() -> Iterator[None]:
    """One chaos module at a time on this machine, across pytest sessions.

    Chaos modules share a Redis database (their workers would consume each other's messages)
    and restart the shared PostgreSQL and Redis servers; two sessions running them at once
    would make each other fail. A second session waits here instead.
    """
    import fcntl

    handle = open(LOCK_PATH, "a+")
    deadline = time.monotonic() + LOCK_WAIT_S
    waited = False
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    print(f"\nwaiting for another chaos run to release {LOCK_PATH}")
                    waited = True
                if time.monotonic() >= deadline:
                    pytest.fail(f"another chaos run held {LOCK_PATH} for more than {LOCK_WAIT_S:g} s")
                time.sleep(0.5)
        yield
    finally:
        handle.close()  # closing the descriptor releases the lock


@pytest.fixture(scope="module")
def chaos_broker_url(redis_url: str, chaos_machine_lock: None) -> Iterator[str]:
    """The session's Redis server, on a database of the chaos suite's own, flushed per module."""
    import redis

    raw_db = os.environ.get("THREADS_TEST_CHAOS_REDIS_DB", "12")
    if not (raw_db.isdigit() and 1 <= int(raw_db) <= 15):
        pytest.fail(f"THREADS_TEST_CHAOS_REDIS_DB must be an integer in 1..15, got {raw_db!r}")
    parts = urlsplit(redis_url)
    url = f"redis://{parts.hostname}:{parts.port or 6379}/{int(raw_db)}"
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.flushdb()
        yield url
        try:
            client.flushdb()
        except redis.RedisError:
            pass
    finally:
        client.close()


@pytest.fixture(scope="module")
def chaos_database_url(pg_url_module: str) -> str:
    """The module's fresh PostgreSQL database, migrated to head."""
    from threads_celery.store import create_store_engine, parse_database_url
    from threads_celery.store.migrate import upgrade

    engine = create_store_engine(parse_database_url(pg_url_module))
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return pg_url_module


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest,
    chaos_database_url: str,
    chaos_broker_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChaosCluster]:
    """The module's chaos cluster; every process it started is SIGKILLed at the end."""
    settings_env = {**DEFAULT_CHAOS_ENV, **getattr(request.module, "CHAOS_ENV", {})}
    directory = tmp_path_factory.mktemp(f"chaos-{request.module.__name__.rpartition('.')[2]}")
    chaos = ChaosCluster(
        database_url=chaos_database_url, broker_url=chaos_broker_url, directory=directory, settings_env=settings_env
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
    for process in _ALL_PROCESSES:
        try:
            if process.log_path.stat().st_mtime < began - 1:
                continue
        except FileNotFoundError:
            continue
        print(f"\n===== {process!r}: {process.log_path} (last 150 lines) =====")
        print(process.log_tail(150))
