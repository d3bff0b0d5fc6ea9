"""Services of the test's own: a PostgreSQL cluster (:class:`PrivatePostgres`) and a
``redis-server`` (:class:`PrivateRedis`), each on a free loopback port in a temporary directory,
started through :class:`~tests.support.processes.ManagedProcess`. Never the machine's servers:
a test may stop, kill and start these at will (the chaos suite restarts them under load).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Self

from tests.support.processes import PG_BIN, ManagedProcess, free_port

# -- services of the test's own ------------------------------------------------------------------


def _service_dir(prefix: str, owner: str | None) -> Path:
    # Under /tmp, not pytest's 0700 base directory: PostgreSQL runs as another user when we are
    # root (initdb refuses root) and must reach its data directory.
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if owner is not None:
        entry = pwd.getpwnam(owner)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    return directory


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own: ``initdb`` in a temporary directory, ``postgres``
    on a free loopback port, trust authentication for user ``postgres``.

    ``stop()`` shuts it down (``fast``, or ``immediate``: a crash, recovered from WAL on the next
    start) and ``start()`` brings it back on the same port and data. Nothing here touches the
    machine's PostgreSQL.
    """

    def __init__(self, *, port: int | None = None, log_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.user = "postgres" if os.geteuid() == 0 else None  # initdb refuses to run as root
        self.directory = _service_dir("threads-test-pg-", self.user)
        self.data = self.directory / "data"
        self.log_path = (log_dir or self.directory) / f"postgres-{self.port}.log"
        self.process: ManagedProcess | None = None

    @staticmethod
    def available() -> str | None:
        """None when initdb and postgres can be run here, else why not."""
        for tool in ("initdb", "postgres"):
            if not (PG_BIN / tool).exists():
                return f"{PG_BIN / tool} not found (set THREADS_TEST_PG_BIN)"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root and there is no 'postgres' user to run initdb as"
        return None

    def init(self) -> PrivatePostgres:
        """Create the cluster (initdb), then start it."""
        as_user: dict[str, object] = {}
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        result = subprocess.run(  # type: ignore[call-overload]
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.directory,
            **as_user,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return self.start()

    def start(self, timeout: float = 60.0) -> PrivatePostgres:
        """Start the server and wait until it accepts connections."""
        argv = [
            str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.directory),
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
            "-c", "max_connections=200", "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        self.process = ManagedProcess(f"postgres:{self.port}", argv, env=dict(os.environ), log_path=self.log_path,
                                      cwd=self.directory, user=self.user)  # fmt: skip
        self.process.start()
        label = f"postgres on port {self.port}"
        self.process.wait_until(self.accepts_connections, label, "accepting connections", timeout=timeout, interval=0.1)
        return self

    def accepts_connections(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
            ) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Shut down: ``fast`` (SIGINT: roll back, disconnect, checkpoint) or ``immediate``
        (SIGQUIT: no checkpoint, crash recovery on the next start)."""
        if self.process is None or not self.process.alive():
            return
        sig = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT, "smart": signal.SIGTERM}[mode]
        assert self.process.proc is not None
        self.process.proc.send_signal(sig)
        try:
            self.process.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create ``name`` (from template0) and return its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        return self.url(name)

    def destroy(self) -> None:
        """Stop the server for good and remove its directory."""
        if self.process is not None:
            self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.init()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class PrivateRedis:
    """A ``redis-server`` of the test's own on a free loopback port, in a temporary directory.

    ``persistent=False`` (the default) keeps nothing on disk, so a restart empties every queue:
    what survives must come back through the ledger's outbox. ``stop()`` is ``SHUTDOWN NOSAVE``
    (or SIGKILL with ``kill=True``); ``start()`` brings it back on the same port.
    """

    def __init__(self, *, port: int | None = None, persistent: bool = False, log_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.persistent = persistent
        self.directory = _service_dir("threads-test-redis-", None)
        self.log_path = (log_dir or self.directory) / f"redis-{self.port}.log"
        self.process: ManagedProcess | None = None

    @staticmethod
    def available() -> str | None:
        """None when redis-server can be run here, else why not."""
        return None if shutil.which("redis-server") else "redis-server is not on PATH"

    def start(self, timeout: float = 30.0) -> PrivateRedis:
        """Start the server and wait until it answers PING."""
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        argv = [
            str(shutil.which("redis-server")), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--save", "", *persistence, "--daemonize", "no",
        ]  # fmt: skip
        self.process = ManagedProcess(f"redis:{self.port}", argv, env=dict(os.environ), log_path=self.log_path,
                                      cwd=self.directory)  # fmt: skip
        self.process.start()
        label = f"redis-server on port {self.port}"
        self.process.wait_until(self.answers, label, "answering PING", timeout=timeout, interval=0.05)
        return self

    def answers(self) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self, *, kill: bool = False, timeout: float = 30.0) -> None:
        """``SHUTDOWN NOSAVE`` (or SIGKILL), then wait for the process to exit."""
        if self.process is None or not self.process.alive():
            return
        if kill:
            self.process.kill()
            return
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        try:
            client.shutdown(nosave=True)
        except redis.RedisError:
            pass  # the connection drops as the server exits
        finally:
            client.close()
        assert self.process.proc is not None
        try:
            self.process.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def destroy(self) -> None:
        if self.process is not None:
            self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


__all__ = ["PrivatePostgres", "PrivateRedis"]
