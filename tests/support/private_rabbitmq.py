"""A ``rabbitmq-server`` of the test's own: its own node name, Mnesia directory and free ports.

Never the machine's broker: the node is ``threads-test-<hex>@localhost``, its data, logs and
Erlang cookie (``HOME``) live in a temporary directory, no plugin is enabled, and the AMQP and
distribution ports are free ones. A test may stop it (SIGTERM: RabbitMQ's own orderly shutdown)
and start it again on the same data, which is how it restarts the broker under a soak. Skips
locally, and fails under ``CI=true``, when ``rabbitmq-server`` is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Self

from tests.support.processes import ManagedProcess, free_port
from tests.support.services import require_service

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"

__all__ = ["PrivateRabbitMQ"]


class PrivateRabbitMQ:
    """``start()``, ``stop()``, ``restart()``, ``url``, ``queue_depth(queue)``."""

    def __init__(self, *, bind: str = "127.0.0.1", port: int | None = None, netns: str | None = None) -> None:
        self.bind = bind
        self.port = port or free_port()
        self.dist_port = free_port()
        self.netns = netns
        self.node = f"threads-test-{uuid.uuid4().hex[:8]}@localhost"
        self.directory = Path(tempfile.mkdtemp(prefix="threads-test-rabbitmq-"))
        self.process: ManagedProcess | None = None
        (self.directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {bind}:{self.port}\nloopback_users = none\n"
        )
        (self.directory / "env.conf").write_text("")
        (self.directory / "enabled_plugins").write_text("[].\n")

    @staticmethod
    def available() -> str | None:
        """None when rabbitmq-server can be run here, else why not."""
        server = SERVER if Path(SERVER).exists() else shutil.which("rabbitmq-server")
        return None if server else "rabbitmq-server is not installed (apt-get install rabbitmq-server)"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.bind}:{self.port}//"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "THREADS_", "CELERY_"))}
        d = self.directory
        env.update(
            HOME=str(d),  # its own Erlang cookie
            RABBITMQ_CONF_ENV_FILE=str(d / "env.conf"),  # not the machine's rabbitmq-env.conf
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS=self.bind,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(d / "plugins"),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def start(self, timeout: float = 90.0) -> Self:
        problem = self.available()
        if problem:
            require_service("rabbitmq-server", False, problem)
        server = SERVER if Path(SERVER).exists() else str(shutil.which("rabbitmq-server"))
        argv = [server] if self.netns is None else ["ip", "netns", "exec", self.netns, server]
        self.process = ManagedProcess(
            f"rabbitmq:{self.port}", argv, env=self._env(), log_path=self.directory / "server.log", cwd=self.directory
        )
        self.process.start()
        label = f"rabbitmq-server on port {self.port}"
        self.process.wait_until(self.answers, label, "accepting connections", timeout=timeout, interval=0.25)
        return self

    def answers(self) -> bool:
        from kombu import Connection

        try:
            with Connection(self.url, connect_timeout=1) as conn:
                conn.ensure_connection(max_retries=1)
            return True
        except Exception:  # noqa: BLE001 - not up (yet)
            return False

    def stop(self, timeout: float = 60.0) -> None:
        """RabbitMQ's orderly shutdown (SIGTERM to the node), SIGKILL if it lingers."""
        process = self.process
        if process is None or process.proc is None or not process.alive():
            return
        process.signal_group(signal.SIGTERM)  # the wrapper script and the Erlang node
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.proc.wait(timeout=timeout)
        process.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def queue_depth(self, queue: str) -> int | None:
        """Messages ready in ``queue`` (a passive declare), None when the broker or queue is not there."""
        from kombu import Connection

        try:
            with Connection(self.url, connect_timeout=2) as conn:
                _name, count, _consumers = conn.default_channel.queue_declare(queue, passive=True)
                return int(count)
        except Exception:  # noqa: BLE001 - down, or no such queue yet
            return None

    def destroy(self) -> None:
        if self.process is not None:
            self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
