"""The subscribing side: ONE bus subscription per process, shared by every local subscriber.

:class:`LiveHub` holds the process's one :class:`~threads_celery.live.bus.Listener` and, per
channel, the local :class:`Subscriber` objects (one per SSE stream, ``threads.stream``, protocol
adapter...). A channel is subscribed on the bus while it has a subscriber and unsubscribed when
its last one leaves. Each message is decoded once, on the listener's thread, and offered to each
subscriber's bounded queue; a subscriber's event loop is woken at most once per batch.

A subscriber that does not keep up never slows the listener nor grows without bound: when its
queue is full (:data:`QUEUE_SIZE` messages, or :data:`QUEUE_CHARS` characters of deltas), its
queued deltas are dropped and it is marked ``overflowed`` (it then sends a ``resync`` and starts
over from its cursor: see :mod:`.subscription`). So is every subscriber of a channel when the
listener says its subscription was cut (:data:`~threads_celery.live.wire.LOST`): what was
published meanwhile never reached this process, and the subscriber must not go on as if it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections import deque

from threads_celery.live.bus import Listener, LiveBus
from threads_celery.live.wire import BusMessage, channel_for, decode

log = logging.getLogger("threads_celery.live.hub")

#: How many messages a subscriber's queue holds before it overflows.
QUEUE_SIZE = 1000
#: How many characters of deltas it holds before it overflows (a few large deltas fill it too).
QUEUE_CHARS = 1_000_000


class Subscriber:
    """One local subscriber's queue of a channel's messages (filled on the listener's thread)."""

    def __init__(
        self, channel: str, loop: asyncio.AbstractEventLoop, max_queue: int, max_chars: int = QUEUE_CHARS
    ) -> None:
        self.channel = channel
        self.loop = loop
        self.max_queue = max_queue
        self.max_chars = max_chars
        self.messages: deque[BusMessage] = deque()
        self.chars = 0
        self.overflowed = False
        #: Why it overflowed: ``overflow`` (it fell behind) or ``lost`` (the subscription was cut).
        self.reason = "overflow"
        self.nudged = False
        self.wake = asyncio.Event()
        self._wake_scheduled = False

    def offer(self, message: BusMessage, chars: int = 0) -> None:
        if message.nudge:
            self.nudged = True
        elif message.lost:
            self._drop("lost")
        elif len(self.messages) >= self.max_queue or self.chars + chars > self.max_chars:
            self._drop("overflow")
        else:
            self.messages.append(message)
            self.chars += chars

    def _drop(self, reason: str) -> None:
        self.messages.clear()
        self.chars = 0
        if not self.overflowed:
            self.reason = reason
        self.overflowed = True

    def signal(self) -> None:
        if self._wake_scheduled:
            return
        self._wake_scheduled = True
        with contextlib.suppress(RuntimeError):  # its loop is closed: the subscriber is going away
            self.loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        self._wake_scheduled = False
        self.wake.set()

    def take(self) -> list[BusMessage]:
        taken: list[BusMessage] = []
        while self.messages:
            taken.append(self.messages.popleft())
        self.chars = 0
        return taken


def _wake_all(subscribers: list[Subscriber]) -> None:
    for subscriber in subscribers:
        subscriber._set()


class LiveHub:
    """A process's live subscriptions over one bus."""

    def __init__(self, bus: LiveBus, *, max_queue: int = QUEUE_SIZE) -> None:
        self.bus = bus
        self.max_queue = max_queue
        self.pid = os.getpid()
        self._listener: Listener | None = None
        self._channels: dict[str, set[Subscriber]] = {}
        self._lock = threading.Lock()

    def channel_of(self, thread_id: str) -> str:
        return channel_for(thread_id, self.bus.namespace)

    def subscribe(self, thread_id: str, loop: asyncio.AbstractEventLoop) -> Subscriber:
        """A new subscriber to the thread's channel (blocking briefly: call it off the event loop)."""
        channel = self.channel_of(thread_id)
        subscriber = Subscriber(channel, loop, self.max_queue)
        with self._lock:
            if self._listener is None:
                self._listener = self.bus.listen(self._deliver)
            listener = self._listener
            subscribers = self._channels.get(channel)
            first = subscribers is None
            self._channels[channel] = (subscribers or set()) | {subscriber}
        if first:
            listener.add(channel)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            subscribers = self._channels.get(subscriber.channel, set()) - {subscriber}
            if subscribers:
                self._channels[subscriber.channel] = subscribers
                return
            self._channels.pop(subscriber.channel, None)
            listener = self._listener
        if listener is not None:
            listener.remove(subscriber.channel)

    def replay(self, channel: str) -> list[BusMessage]:
        """The channel's buffered messages of the step in progress (blocking)."""
        listener = self._listener
        if listener is None:
            return []
        return [m for m in (decode(p) for p in listener.replay(channel)) if m is not None]

    def _deliver(self, batch: list[tuple[str, bytes]]) -> None:
        touched: set[Subscriber] = set()
        channels = self._channels
        for channel, payload in batch:
            subscribers = channels.get(channel)
            if not subscribers:
                continue
            message = decode(payload)
            if message is None:
                continue
            chars = sum(len(f[3]) for f in message.fragments)
            for subscriber in subscribers:
                subscriber.offer(message, chars)
                touched.add(subscriber)
        # One wake-up per event loop for the whole batch (each costs the loop a write to its
        # self-pipe), not one per subscriber.
        by_loop: dict[asyncio.AbstractEventLoop, list[Subscriber]] = {}
        for subscriber in touched:
            if not subscriber._wake_scheduled:
                subscriber._wake_scheduled = True
                by_loop.setdefault(subscriber.loop, []).append(subscriber)
        for loop, woken in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: its subscribers are going away
                loop.call_soon_threadsafe(_wake_all, woken)

    @property
    def channel_count(self) -> int:
        return len(self._channels)

    @property
    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._channels.values())

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            self._channels.clear()
        if listener is not None:
            listener.close()


_hubs: dict[int, LiveHub] = {}
_hubs_lock = threading.Lock()


def hub_for(bus: LiveBus) -> LiveHub:
    """This process's hub for ``bus`` (made on first use)."""
    with _hubs_lock:
        hub = _hubs.get(id(bus))
        if hub is None or hub.bus is not bus or hub.pid != os.getpid():
            hub = LiveHub(bus)
            _hubs[id(bus)] = hub
        return hub


__all__ = ["QUEUE_CHARS", "QUEUE_SIZE", "LiveHub", "Subscriber", "hub_for"]
