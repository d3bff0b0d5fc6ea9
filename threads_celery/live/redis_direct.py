"""Writing live messages to Redis from a model turn's thread, without ever blocking it.

One connection per process, put in ``CLIENT REPLY OFF`` mode (Redis sends nothing back, so there
is nothing to wait for or to read) and made non-blocking: a message is one ``send`` of its
commands, encoded here as Redis's protocol (RESP) arrays. When the socket cannot take the bytes
at once (Redis is slow or gone), the message is dropped and the connection closed; a new one is
made on a thread of its own, at most once per pause, so a dead Redis never costs a model turn
more than a failed ``send``.

Plain ``redis://`` only (TLS needs a blocking handshake: ``rediss://`` uses the sender's thread).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from threads_celery.live.reconnect import Reconnects

log = logging.getLogger("threads_celery.live.redis_direct")

CONNECT_TIMEOUT_S = 0.5


def resp(*args: bytes) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class DirectRedis:
    """A fire-and-forget, non-blocking connection to Redis (see the module's docstring)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        self.db = (parts.path or "/0").strip("/") or "0"
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self._sock: socket.socket | None = None
        # A forked child must not write on its parent's socket: it makes its own.
        os.register_at_fork(after_in_child=self._forget)
        self._lock = threading.Lock()
        self._reconnects = Reconnects(self._connect, "threads-live-redis-connect")

    def write(self, commands: Sequence[bytes]) -> bool:
        """Send ``commands`` (RESP-encoded) now; False when they were dropped."""
        data = b"".join(commands)
        with self._lock:
            sock = self._sock
            if sock is None:
                self._reconnects.soon()
                return False
            try:
                sent = sock.send(data)
            except (BlockingIOError, OSError) as exc:
                self._drop(sock, exc)
                return False
            if sent < len(data):  # half a command on the wire: this connection is done for
                self._drop(sock, BlockingIOError("the socket took part of a message"))
                return False
            return True

    def _forget(self) -> None:
        self._sock, self._lock = None, threading.Lock()
        self._reconnects = Reconnects(self._connect, "threads-live-redis-connect")

    def connect_soon(self) -> None:
        """Start connecting (on a thread of its own)."""
        with self._lock:
            self._reconnects.soon()

    def _drop(self, sock: socket.socket, exc: BaseException) -> None:
        log.warning("live deltas: Redis connection dropped (%s: %s)", type(exc).__name__, exc)
        sock.close()
        self._sock = None
        self._reconnects.lost()

    def _connect(self) -> None:
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            setup: list[bytes] = []
            if self.password is not None:
                auth = [self.username.encode(), self.password.encode()] if self.username else [self.password.encode()]
                setup.append(resp(b"AUTH", *auth))
            setup.append(resp(b"SELECT", self.db.encode()))
            sock.sendall(b"".join(setup))
            replies = b""
            while replies.count(b"\r\n") < len(setup):
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("Redis closed the connection")
                replies += chunk
            if not all(line.startswith(b"+OK") for line in replies.split(b"\r\n")[: len(setup)]):
                raise ConnectionError(f"Redis refused the connection's setup: {replies[:200]!r}")
            sock.sendall(resp(b"CLIENT", b"REPLY", b"OFF"))
            sock.setblocking(False)
        except Exception as exc:  # noqa: BLE001 - best effort: retried after a pause
            if sock is not None:
                sock.close()
            with self._lock:
                self._reconnects.lost()
            log.warning(
                "live deltas: cannot reach Redis at %s:%s (%s: %s)", self.host, self.port, type(exc).__name__, exc
            )
            return
        with self._lock:
            self._sock = sock
            self._reconnects.made()


__all__ = ["DirectRedis", "resp"]
