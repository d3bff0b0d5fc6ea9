"""RabbitMQ on the fleet's broker host: a :class:`~tests.support.private_rabbitmq.PrivateRabbitMQ`
run inside the host's network namespace, with an ``epmd`` of its own there, and reached by the
test process through a proxy.

- The node listens on the broker host's address; workers, Beat and the API connect to it there
  (:attr:`HostRabbitMQ.fleet_url`), so every fault on their links is a fault on the broker's.
- Erlang's port mapper (``epmd``) is started by the test, in the namespace, as a process of its
  own: left to itself, ``rabbitmq-server`` would start one as a daemon that outlives the node and
  keeps the namespace busy. It is killed with the rest at teardown.
- The test process stays in the machine's namespace, and RabbitMQ speaks TCP only: a proxy
  (:mod:`tests.fleet.delay_proxy` with ``--to-netns``) listens on a free port of 127.0.0.1 here
  and connects from inside the broker's namespace (:attr:`HostRabbitMQ.url`). No fault touches it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Self

from tests.support.private_rabbitmq import PrivateRabbitMQ
from tests.support.processes import REPO_ROOT, ManagedProcess, free_port
from tests.support.waiting import Deadline

AMQP_PORT = 5672

__all__ = ["AMQP_PORT", "HostRabbitMQ"]


class HostRabbitMQ(PrivateRabbitMQ):
    """RabbitMQ in namespace ``netns`` at ``address``; ``start()``, ``stop()``, ``destroy()``."""

    def __init__(self, netns: str, address: str) -> None:
        super().__init__(bind=address, port=AMQP_PORT, netns=netns)
        self.netns_name = netns
        self.proxy_port = free_port()
        self.epmd: ManagedProcess | None = None
        self.proxy: ManagedProcess | None = None

    @property
    def fleet_url(self) -> str:
        """The URL the fleet's hosts use: the broker host's own address."""
        return f"amqp://guest:guest@{self.bind}:{self.port}//"

    @property
    def url(self) -> str:
        """The URL the test process uses: the proxy into the broker's namespace."""
        return f"amqp://guest:guest@127.0.0.1:{self.proxy_port}//"

    def _in_ns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns_name, *argv]

    def start(self, timeout: float = 90.0) -> Self:
        if self.proxy is None:
            argv = [sys.executable, "-m", "tests.fleet.delay_proxy", "--listen", f"127.0.0.1:{self.proxy_port}",
                    "--to", f"{self.bind}:{self.port}", "--to-netns", self.netns_name]  # fmt: skip
            self.proxy = ManagedProcess("amqp-proxy", argv, env=dict(os.environ),
                                        log_path=self.directory / "proxy.log", cwd=REPO_ROOT)  # fmt: skip
            self.proxy.start()
            self.proxy.wait_for_log("ready", timeout=30)
        if self.epmd is None or not self.epmd.alive():
            self._start_epmd()
        return super().start(timeout)

    def _start_epmd(self) -> None:
        epmd = shutil.which("epmd") or "epmd"
        env = {**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1"}
        self.epmd = ManagedProcess("epmd", self._in_ns([epmd]), env=env,
                                   log_path=self.directory / "epmd.log", cwd=self.directory)  # fmt: skip
        self.epmd.start()
        deadline = Deadline(30)
        while subprocess.run(self._in_ns([epmd, "-names"]), capture_output=True, timeout=10, check=False).returncode:
            deadline.check("epmd in the broker host")
            time.sleep(0.1)

    def destroy(self) -> None:
        for process in (self.proxy, self.epmd):
            if process is not None:
                process.kill()
        super().destroy()
