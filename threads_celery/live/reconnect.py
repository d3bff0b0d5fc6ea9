"""When a live publisher's dropped connection is made again: on a thread of its own, one attempt
at a time, after a pause that doubles from :data:`FIRST_RETRY_S` up to :data:`MAX_RETRY_S`. So a
broker that is gone costs a model turn a dropped message, never a wait (see
:mod:`.redis_direct` and :mod:`.amqp_bus`, whose direct publishers use it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0


class Reconnects:
    """The reconnection state of one connection; its owner calls it under the owner's own lock."""

    def __init__(self, connect: Callable[[], None], thread_name: str) -> None:
        self._connect = connect
        self._thread_name = thread_name
        self.connecting = False
        self._retry_at = 0.0
        self._retry_s = FIRST_RETRY_S

    def soon(self) -> None:
        """Start an attempt on a thread of its own, unless one runs or the pause is not over."""
        if self.connecting or time.monotonic() < self._retry_at:
            return
        self.connecting = True
        threading.Thread(target=self._connect, name=self._thread_name, daemon=True).start()

    def lost(self) -> None:
        """The connection dropped, or an attempt failed: the next waits out a longer pause."""
        self.connecting = False
        self._retry_at = time.monotonic() + self._retry_s
        self._retry_s = min(self._retry_s * 2, MAX_RETRY_S)

    def made(self) -> None:
        """An attempt succeeded: the next loss pauses briefly again."""
        self.connecting = False
        self._retry_s = FIRST_RETRY_S


__all__ = ["FIRST_RETRY_S", "MAX_RETRY_S", "Reconnects"]
