"""A PostgreSQL server of the test's own, on a free port: a test may stop and start it at will.

Never the machine's server (other people's tests use it). ``initdb`` refuses to run as root, so
under root the server runs as the ``postgres`` user (``runuser``). Skips locally, and fails under
``CI=true``, when the PostgreSQL binaries are not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.services import require_service

__all__ = ["OwnPostgres", "own_postgres"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    return None


class OwnPostgres:
    """One throwaway cluster: ``start()``, ``stop()``, ``url(database)``; trust auth on loopback."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.data = root / "data"
        initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            require_service("PostgreSQL binaries (initdb, pg_ctl)", False, "not installed")
        assert initdb is not None and pg_ctl is not None
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_user, *argv], check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self._run(self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            self.pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "-t", "60", "start"
        )

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextmanager
def own_postgres() -> Iterator[OwnPostgres]:
    """A started server of our own; stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="tc-own-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres", group="postgres")
    server = OwnPostgres(root, _free_port())
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
