"""The processes tests start: workers, Beat, services of their own, any other command.

Every process runs in its own session (process group), logs to its own file, and is SIGKILLed as
a group when the test that started it is done (and, whatever happened, when the interpreter
exits). Tests that kill, freeze or restart something only ever do it to processes started here:

- :class:`WorkerProcess`: ``celery -A tasks worker`` (or ``threads-celery worker``);
- :class:`BeatProcess`: ``celery -A tasks beat`` (or ``threads-celery beat``);
- :class:`~tests.support.private_services.PrivatePostgres` and
  :class:`~tests.support.private_services.PrivateRedis` (in their own module): a PostgreSQL
  cluster (``initdb``) and a ``redis-server`` of the test's own, on free loopback ports, that a
  test may stop and start again without touching the machine's services;
- :class:`ManagedProcess`: anything else (the HTTP API, Flower, a web app).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self

from tests.support.waiting import Deadline

REPO_ROOT = Path(__file__).resolve().parents[2]


def _find_pg_bin() -> Path:
    """Where ``initdb`` and ``postgres`` are: ``THREADS_TEST_PG_BIN``, else /usr/local/bin, the
    directory of an ``initdb`` on PATH, or the newest Debian /usr/lib/postgresql/<n>/bin."""
    if os.environ.get("THREADS_TEST_PG_BIN"):
        return Path(os.environ["THREADS_TEST_PG_BIN"])
    on_path = shutil.which("initdb")
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0
    )
    for candidate in (Path("/usr/local/bin"), *([Path(on_path).parent] if on_path else []), *reversed(debian)):
        if (candidate / "initdb").exists() and (candidate / "postgres").exists():
            return candidate
    return Path("/usr/local/bin")


PG_BIN = _find_pg_bin()
#: The ``threads-celery`` command of this interpreter's environment.
THREADS_CELERY = str(Path(sys.executable).with_name("threads-celery"))

__all__ = [
    "REPO_ROOT",
    "THREADS_CELERY",
    "BeatProcess",
    "ManagedProcess",
    "WorkerProcess",
    "exit_cleanly_on_sigterm",
    "free_port",
    "kill_all",
    "queued_messages",
    "started_processes",
    "subprocess_env",
]

_STARTED: list[ManagedProcess] = []


def started_processes() -> list[ManagedProcess]:
    """Every process started through this module in this interpreter, oldest first."""
    return list(_STARTED)


def kill_all() -> None:
    """SIGKILL every process group started here (a last resort at exit)."""
    for process in _STARTED:
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            process.kill()


atexit.register(kill_all)


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``, a CI runner giving up) into SystemExit, so that finalizers run
    and every process started here is killed instead of outliving this one. Leaves a handler
    someone else installed alone."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def subprocess_env(
    extra: Mapping[str, str] | None = None,
    *,
    drop_prefixes: Sequence[str] = ("THREADS_", "CELERY_"),
) -> dict[str, str]:
    """This process's environment without its ``THREADS_*``/``CELERY_*`` settings, plus ``extra``.

    The repository is on ``PYTHONPATH`` (so ``-A tasks`` and test agent modules import) and output
    is unbuffered (so logs are complete when a process is killed).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop_prefixes))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def queued_messages(broker_url: str, queue: str = "threads") -> int:
    """How many messages wait in a Redis queue, over every priority list kombu keeps for it
    (``threads``, ``threads\\x06\\x163``, ...); 0 while Redis does not answer."""
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        keys = [queue, *(f"{queue}\x06\x16{priority}" for priority in (3, 6, 9))]
        return sum(int(client.llen(key)) for key in keys)
    except redis.RedisError:
        return 0
    finally:
        client.close()


class ManagedProcess:
    """A subprocess in its own process group, logging to its own file."""

    kind = "process"

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path,
        cwd: Path = REPO_ROOT,
        user: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else subprocess_env()
        self.log_path = log_path
        self.cwd = cwd
        self.user = user
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    def start(self) -> ManagedProcess:
        """Start the process (appending to its log); returns self."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        as_user: dict[str, object] = {}
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill() takes the children too
                **as_user,
            )
        self.stopped = False
        if self not in _STARTED:
            _STARTED.append(self)
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

    def wait_for_log(self, pattern: str, *, timeout: float = 60.0, what: str | None = None) -> re.Match[str]:
        """Poll the log until ``pattern`` (a regex) matches; AssertionError after ``timeout`` or
        when the process exits first."""
        regex = re.compile(pattern)
        deadline = Deadline(timeout)
        while True:
            found = regex.search(self.log_text())
            if found:
                return found
            if not self.alive():
                raise AssertionError(f"{self.name} exited before {what or pattern!r}:\n{self.log_tail()}")
            if deadline.passed():
                raise AssertionError(
                    f"{self.name}: {what or pattern!r} did not appear in its log within {timeout:g} s\n"
                    f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def wait_until(self, ready: Callable[[], bool], label: str, state: str, *, timeout: float, interval: float) -> None:
        """Poll ``ready`` every ``interval`` s until it holds: a service's start. RuntimeError with
        the log's tail when the process exits first; the deadline's error, waiting for
        ``"<label> <state>"``, after ``timeout``."""
        deadline = Deadline(timeout)
        while not ready():
            if not self.alive():
                raise RuntimeError(f"{label} exited:\n{self.log_tail()}")
            deadline.check(f"{label} {state}")
            time.sleep(interval)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (a no-op once it is gone)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (the process and every child) and reap it."""
        if self.proc is None:
            return
        self.signal_group(signal.SIGKILL)
        self.stopped = False
        with contextlib.suppress(subprocess.TimeoutExpired):  # a zombie we cannot reap
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGSTOP the whole group: it stays alive but runs nothing (its lease keeper neither)."""
        self.signal_group(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        """SIGCONT the whole group."""
        self.signal_group(signal.SIGCONT)
        self.stopped = False

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGTERM (a warm shutdown for Celery), then SIGKILL the group if it lingers."""
        if self.proc is None:
            return
        if self.stopped:
            self.cont()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def __repr__(self) -> str:
        state = "alive" if self.alive() else "dead"
        return f"<{self.kind} {self.name} pid={self.proc.pid if self.proc else None} {state}>"


class WorkerProcess(ManagedProcess):
    """A Celery worker running the threads tasks: ``celery -A tasks worker`` by default, or
    ``threads-celery worker`` with ``cli=True``."""

    kind = "worker"

    def __init__(
        self,
        name: str,
        *,
        env: Mapping[str, str],
        log_path: Path,
        concurrency: int = 2,
        pool: str = "prefork",
        queues: Iterable[str] | None = None,
        cli: bool = False,
        extra_args: Sequence[str] = (),
        cwd: Path = REPO_ROOT,
        app: str = "tasks",
    ) -> None:
        if cli:
            argv = [THREADS_CELERY, "worker"]
        else:
            argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-n", f"{name}@%h",
                    "--without-mingle", "--without-gossip"]  # fmt: skip
        argv += ["--pool", pool, "--concurrency", str(concurrency), "--loglevel", "INFO"]
        if queues is not None:
            argv += ["-Q", ",".join(queues)]
        argv += list(extra_args)
        super().__init__(name, argv, env=env, log_path=log_path, cwd=cwd)
        self.cli = cli

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Wait until the worker logs that it is ready (and still runs)."""
        pattern = r"\S+@\S+ ready\." if self.cli else rf"{re.escape(self.name)}@\S+ ready\."
        self.wait_for_log(pattern, timeout=timeout, what="worker ready")
        return self

    @contextlib.contextmanager
    def running(self, timeout: float = 60.0) -> Iterator[WorkerProcess]:
        """The worker started and ready for the block (a module fixture's body), then terminated."""
        self.start()
        try:
            self.wait_ready(timeout)
            yield self
        finally:
            self.terminate()

    def child_pids(self) -> list[int]:
        """The prefork pool's processes (children of the worker's main process)."""
        if not self.alive():
            return []
        pids: set[int] = set()
        try:
            for children in Path(f"/proc/{self.pid}/task").glob("*/children"):
                pids.update(int(p) for p in children.read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
        if not pids:  # kernels without /proc/<pid>/task/<tid>/children
            out = subprocess.run(
                ["ps", "-o", "pid=", "--ppid", str(self.pid)],
                capture_output=True,
                text=True,
                check=False,
            )
            pids.update(int(p) for p in out.stdout.split())
        return sorted(pids)

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is one of this worker's pool processes."""
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
    """Celery Beat publishing the reconcile backbone every ``THREADS_RECONCILE_INTERVAL_S``:
    ``celery -A tasks beat`` by default, ``threads-celery beat`` with ``cli=True``."""

    kind = "beat"

    def __init__(
        self,
        name: str,
        *,
        env: Mapping[str, str],
        log_path: Path,
        schedule_path: Path | None,
        cli: bool = False,
        cwd: Path = REPO_ROOT,
    ) -> None:
        # schedule_path None: Beat's own default (.threads-celery/celerybeat-schedule in ``cwd``).
        schedule = [] if schedule_path is None else ["--schedule", str(schedule_path)]
        command = [THREADS_CELERY, "beat"] if cli else [sys.executable, "-m", "celery", "-A", "tasks", "beat"]
        super().__init__(name, [*command, *schedule, "--loglevel", "INFO"], env=env, log_path=log_path, cwd=cwd)

    def wait_ready(self, timeout: float = 60.0) -> BeatProcess:
        self.wait_for_log(r"beat: Starting", timeout=timeout, what="beat start-up")
        return self

    def ticks_sent(self) -> int:
        """How many reconcile ticks this Beat logged as sent."""
        return len(re.findall(r"Sending due task threads-reconcile", self.log_text()))
