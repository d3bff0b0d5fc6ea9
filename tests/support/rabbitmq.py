"""A virtual host of the test's own on the machine's RabbitMQ, deleted afterwards.

Tests publish and consume on it only: queues, exchanges and messages live and die with the vhost,
and the broker itself is never reconfigured or restarted (a test that restarts RabbitMQ starts a
server of its own: tests/fleet/rabbitmq.py). ``rabbitmqctl`` makes and deletes the vhost, so it
must be installed and allowed to talk to the node (root, or the broker's Erlang cookie).
``THREADS_TEST_RABBITMQ_URL`` names the server (default ``amqp://guest:guest@127.0.0.1:5672//``);
skipped locally and failed under ``CI=true`` when it does not answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, urlsplit, urlunsplit

from tests.support.services import require_service

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672//"

__all__ = ["rabbitmq_vhost"]


def _answers(url: str) -> str | None:
    """None when the broker at ``url`` accepts a connection, else why not."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not reachable"
        return f"{type(exc).__name__}: {exc}"
    return None


def _ctl(*argv: str) -> subprocess.CompletedProcess[str]:
    ctl = shutil.which("rabbitmqctl")
    assert ctl is not None
    return subprocess.run([ctl, "-q", *argv], capture_output=True, text=True, timeout=60, check=False)


@contextmanager
def rabbitmq_vhost(prefix: str = "threads-test") -> Iterator[str]:
    """The URL of a fresh vhost (``<prefix>-<hex>``) on which ``guest`` may do anything."""
    base = os.environ.get("THREADS_TEST_RABBITMQ_URL", DEFAULT_URL)
    parts = urlsplit(base)
    problem = _answers(base)
    require_service("RabbitMQ", problem is None, problem or "", address=f"{parts.hostname}:{parts.port or 5672}")
    if shutil.which("rabbitmqctl") is None:
        require_service("rabbitmqctl", False, "not installed (it makes the test's own vhost)")
    vhost = f"{prefix}-{uuid.uuid4().hex[:10]}"
    made = _ctl("add_vhost", vhost)
    if made.returncode != 0:
        require_service("rabbitmqctl", False, f"add_vhost failed: {made.stderr.strip() or made.stdout.strip()}")
    try:
        user = parts.username or "guest"
        allowed = _ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        assert allowed.returncode == 0, allowed.stderr
        yield urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))
    finally:
        _ctl("delete_vhost", vhost)
