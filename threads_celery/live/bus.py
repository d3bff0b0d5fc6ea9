"""Where live messages go: the broker's Redis, a RabbitMQ fanout exchange, or this process.

A :class:`LiveBus` has two sides. The worker's sender thread calls :meth:`LiveBus.send` with a
batch of :class:`Outgoing` messages (one round trip where the transport allows). A subscribing
process opens ONE :class:`Listener` (:meth:`LiveBus.listen`), which hands every message of the
channels it was asked for to one callback, and reads a channel's replay buffer.

The transport follows the broker URL (:func:`~threads_celery.live.transports.bus_for`): ``redis://``/``rediss://`` publish on
Redis, ``amqp://``/``pyamqp://`` on RabbitMQ, and anything else (the embedded ``memory://``
broker) in this process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from threads_celery.live.buffers import BufferOp, ReplayBuffers

#: Receives a batch of (channel, payload) as they arrive, on the listener's own thread.
Deliver = Callable[[list[tuple[str, bytes]]], None]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish on ``channel``, and what it does to the channel's replay buffer."""

    channel: str
    payload: bytes
    buffer: BufferOp


class Listener(Protocol):
    """A process's one subscription: channels are added and removed as subscribers come and go."""

    def add(self, channel: str) -> None: ...

    def remove(self, channel: str) -> None: ...

    def replay(self, channel: str) -> list[bytes]:
        """The channel's replay buffer, oldest first (blocking: call it off the event loop)."""
        ...

    def close(self) -> None: ...


class LiveBus(Protocol):
    """A transport for live messages."""

    #: Separates ledgers that share one broker (pub/sub channels span a Redis server's databases).
    namespace: str

    def send(self, batch: Sequence[Outgoing]) -> None:
        """Publish ``batch`` in order (blocking; raises when the transport is unreachable)."""
        ...

    def listen(self, deliver: Deliver) -> Listener: ...


class MemoryBus:
    """The embedded default's bus: a worker thread and its subscribers share this process."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace
        self.buffers = ReplayBuffers()
        self._listeners: list[_MemoryListener] = []
        self._lock = threading.Lock()

    def send(self, batch: Sequence[Outgoing]) -> None:
        for out in batch:
            self.buffers.apply(out.channel, out.payload, out.buffer)
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            wanted = [(o.channel, o.payload) for o in batch if o.channel in listener.channels]
            if wanted:
                listener.deliver(wanted)

    def listen(self, deliver: Deliver) -> Listener:
        listener = _MemoryListener(self, deliver)
        with self._lock:
            self._listeners.append(listener)
        return listener

    def _forget(self, listener: _MemoryListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


class _MemoryListener:
    def __init__(self, bus: MemoryBus, deliver: Deliver) -> None:
        self.bus = bus
        self.deliver = deliver
        self.channels: set[str] = set()

    def add(self, channel: str) -> None:
        self.channels = self.channels | {channel}

    def remove(self, channel: str) -> None:
        self.channels = self.channels - {channel}

    def replay(self, channel: str) -> list[bytes]:
        return self.bus.buffers.replay(channel)

    def close(self) -> None:
        self.bus._forget(self)


__all__ = ["Deliver", "Listener", "LiveBus", "MemoryBus", "Outgoing"]
