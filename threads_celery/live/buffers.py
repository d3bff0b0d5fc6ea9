"""An in-memory replay buffer: the messages of each thread's step in progress, bounded and expiring.

The embedded bus keeps its replay here, and so does each API process on RabbitMQ (fed by the
fanout exchange). A channel's buffer is reset when a step attempt starts streaming and dropped
when it ends; it holds at most :data:`MAX_MESSAGES` messages (the oldest go first), expires
:data:`TTL_S` after its last message, and at most :data:`MAX_CHANNELS` channels are kept (the
least recently written go first). Redis keeps the same buffer as a capped list with a TTL.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import Literal

#: What a published message does to its channel's replay buffer.
BufferOp = Literal["append", "reset", "clear", "none"]

MAX_MESSAGES = 4096
TTL_S = 600.0
MAX_CHANNELS = 10_000


class ReplayBuffers:
    """Each channel's messages of the step in progress (thread-safe)."""

    def __init__(
        self, *, max_messages: int = MAX_MESSAGES, ttl_s: float = TTL_S, max_channels: int = MAX_CHANNELS
    ) -> None:
        self.max_messages = max_messages
        self.ttl_s = ttl_s
        self.max_channels = max_channels
        self._buffers: OrderedDict[str, tuple[deque[bytes], float]] = OrderedDict()
        self._lock = threading.Lock()

    def apply(self, channel: str, payload: bytes, op: BufferOp) -> None:
        if op == "none":
            return
        with self._lock:
            if op == "clear":
                self._buffers.pop(channel, None)
                return
            found = self._buffers.pop(channel, None)
            messages = found[0] if found is not None and op == "append" else deque(maxlen=self.max_messages)
            messages.append(payload)
            self._buffers[channel] = (messages, time.monotonic() + self.ttl_s)
            while len(self._buffers) > self.max_channels:
                self._buffers.popitem(last=False)

    def replay(self, channel: str) -> list[bytes]:
        with self._lock:
            found = self._buffers.get(channel)
            if found is None:
                return []
            if found[1] < time.monotonic():
                del self._buffers[channel]
                return []
            return list(found[0])

    def expire(self) -> None:
        """Drop the buffers past their time (each write also moves its channel to the end)."""
        now = time.monotonic()
        with self._lock:
            while self._buffers:
                channel, (_, until) = next(iter(self._buffers.items()))
                if until >= now:
                    break
                del self._buffers[channel]

    def __len__(self) -> int:
        return len(self._buffers)


__all__ = ["MAX_MESSAGES", "TTL_S", "BufferOp", "ReplayBuffers"]
