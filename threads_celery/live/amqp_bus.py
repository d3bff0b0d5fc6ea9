"""Live messages on RabbitMQ: a fanout exchange, one queue per subscribing process.

Workers publish every message, transient, to the fanout exchange ``threads.live`` (the channel as
the routing key, what it does to the replay buffer in a header). Each subscribing process binds
one exclusive, auto-deleted queue (bounded: the oldest are dropped past
:data:`QUEUE_MAX_LENGTH`, and a message older than a minute is dropped) and reads it on a thread
of its own (:class:`AmqpListener`).

On ``amqp://`` (plain TCP) a worker publishes from the caller's own thread, at once, on a
connection opened on a thread of its own and then made non-blocking (:meth:`AmqpBus.send_now`):
a publish the socket cannot take whole is dropped with its connection, never waited for, so a
slow or cut broker never holds a model turn up. Handing each message to the sender's thread
instead cost a pool process more than the publish itself (the two threads trading the GIL).
``amqps://`` goes through the sender's thread (:meth:`AmqpBus.send`).

The replay buffer lives in that process (:class:`~threads_celery.live.buffers.ReplayBuffers`,
bounded and expiring), fed by the fanout with the messages of every thread, not only of those
it streams: so a client reconnecting to any API process gets the step in progress from its start
(as long as that process was up when the step started). The price is that each API process
receives every thread's deltas; a fleet larger than that suits is what Redis is for.

A listener that connects again after losing its connection (its queue went with it) empties the
replay buffers, which miss what was published meanwhile, and tells each channel's subscribers
that messages were lost (:data:`~threads_celery.live.wire.LOST`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import amqp
from kombu import Connection, Consumer, Exchange, Queue

from threads_celery.live.buffers import ReplayBuffers
from threads_celery.live.bus import Deliver, Outgoing
from threads_celery.live.reconnect import Reconnects
from threads_celery.live.wire import LOST

log = logging.getLogger("threads_celery.live.amqp_bus")

EXCHANGE = Exchange("threads.live", type="fanout", durable=False, auto_delete=False, delivery_mode=1)
QUEUE_MAX_LENGTH = 100_000
CONNECT_TIMEOUT_S = 0.5
LISTEN_TICK_S = 0.02


def _publish(channel: Any, batch: Sequence[Outgoing]) -> None:
    """Publish ``batch`` on ``channel`` (py-amqp's, under kombu's) to the fanout exchange: a
    transient message each, the channel as its routing key, its replay-buffer op in a header."""
    for out in batch:
        message = amqp.Message(
            out.payload,
            content_type="application/data",
            content_encoding="binary",
            application_headers={"op": out.buffer},
            delivery_mode=1,
        )
        channel.basic_publish(message, exchange=EXCHANGE.name, routing_key=out.channel)


def _connect(url: str) -> tuple[Any, Any]:
    """A connection and a channel with the fanout exchange declared (once, here: a publish on the
    direct connection must never wait for a reply)."""
    connection = Connection(url, connect_timeout=CONNECT_TIMEOUT_S)
    channel = connection.channel()
    EXCHANGE(channel).declare()
    return connection, channel


def _release(connection: Any) -> None:
    if connection is not None:
        with contextlib.suppress(Exception):  # releasing a broken connection
            connection.release()


class AmqpBus:
    """Publishes on, and listens to, a RabbitMQ fanout exchange."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self._connection: Any = None
        self._channel: Any = None
        #: Whether messages are published at once from the caller's thread (plain ``amqp://``).
        self.direct = url.startswith(("amqp://", "pyamqp://"))
        self._direct: tuple[Any, Any] | None = None  # (connection, channel), non-blocking
        self._lock = threading.Lock()
        self._reconnects = Reconnects(self._connect_direct, "threads-live-amqp-connect")
        # A forked child must not publish on its parent's connection: it makes its own.
        os.register_at_fork(after_in_child=self._forget)

    def send(self, batch: Sequence[Outgoing]) -> None:
        try:
            if self._channel is None:
                self._connection, self._channel = _connect(self.url)
            _publish(self._channel, batch)
        except Exception:
            self._reset()
            raise

    def _reset(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        _release(connection)

    # -- at once, from the caller's thread (plain amqp://) ------------------------------------

    def prepare(self) -> None:
        """Open the direct connection now, on a thread of its own (a worker's sender calls this
        when it starts: the connection is up before its first message)."""
        if self.direct:
            with self._lock:
                self._reconnects.soon()

    def send_now(self, batch: Sequence[Outgoing]) -> bool:
        """Publish ``batch`` at once on the non-blocking connection; False: dropped (no
        connection yet, or the socket could not take it whole: that connection is then done)."""
        with self._lock:
            direct = self._direct
            if direct is None:
                self._reconnects.soon()
                return False
            try:
                _publish(direct[1], batch)
            except Exception as exc:  # noqa: BLE001 - best effort: dropped, and connected again later
                self._drop(exc)
                return False
            return True

    def _forget(self) -> None:
        self._direct, self._lock = None, threading.Lock()
        self._reconnects = Reconnects(self._connect_direct, "threads-live-amqp-connect")
        self._connection = self._channel = None

    def _drop(self, exc: BaseException) -> None:
        log.warning("live deltas: RabbitMQ connection dropped (%s: %s)", type(exc).__name__, exc)
        direct, self._direct = self._direct, None
        if direct is not None:
            with contextlib.suppress(Exception):  # a socket that took half a frame
                direct[0].connection.transport.sock.setblocking(True)
            _release(direct[0])
        self._reconnects.lost()

    def _connect_direct(self) -> None:
        connection: Any = None
        try:
            connection, channel = _connect(self.url)
            # A publish must never read: py-amqp drains incoming frames before each publish when
            # the connection negotiated broker "blocked" notices, and on a non-blocking socket a
            # frame half received would make its reader spin. Left unread, a notice costs nothing:
            # a broker that blocks publishers stops reading, the socket stops taking messages,
            # and the connection is dropped and made again later.
            capabilities = connection.connection.client_properties.get("capabilities") or {}
            capabilities["connection.blocked"] = False
            connection.connection.transport.sock.setblocking(False)
        except Exception as exc:  # noqa: BLE001 - tried again on a later send
            _release(connection)
            with self._lock:
                self._reconnects.lost()
            log.warning("live deltas: cannot connect to RabbitMQ (%s: %s)", type(exc).__name__, exc)
            return
        with self._lock:
            self._reconnects.made()
            self._direct = (connection, channel)

    def listen(self, deliver: Deliver) -> AmqpListener:
        return AmqpListener(self, deliver)


class AmqpListener:
    """One queue on the fanout for the process, read on its own thread, feeding the replay buffers."""

    def __init__(self, bus: AmqpBus, deliver: Deliver) -> None:
        self.bus = bus
        self.deliver = deliver
        self.buffers = ReplayBuffers()
        self.channels: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._batch: list[tuple[str, bytes]] = []
        self._thread = threading.Thread(target=self._run, name="threads-live-amqp", daemon=True)
        self._thread.start()

    def add(self, channel: str) -> None:
        with self._lock:
            self.channels = self.channels | {channel}

    def remove(self, channel: str) -> None:
        with self._lock:
            self.channels = self.channels - {channel}

    def replay(self, channel: str) -> list[bytes]:
        return self.buffers.replay(channel)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _on_message(self, body: Any, message: Any) -> None:
        channel = str(message.delivery_info.get("routing_key", ""))
        raw = message.body
        payload = raw if isinstance(raw, bytes) else str(raw).encode()
        op = (message.headers or {}).get("op", "none")
        if op in ("append", "reset", "clear"):
            self.buffers.apply(channel, payload, op)
        if channel in self.channels:
            self._batch.append((channel, payload))

    def _run(self) -> None:
        backoff = 0.1
        cut = False
        while not self._stop.is_set():
            try:
                with Connection(self.bus.url, connect_timeout=2.0) as connection:
                    queue = Queue(
                        f"threads.live.{uuid.uuid4().hex}",
                        exchange=EXCHANGE,
                        exclusive=True,
                        auto_delete=True,
                        durable=False,
                        queue_arguments={"x-max-length": QUEUE_MAX_LENGTH, "x-message-ttl": 60_000},
                    )
                    with Consumer(
                        connection,
                        queues=[queue],
                        callbacks=[self._on_message],
                        no_ack=True,
                        accept=["application/data"],
                    ):
                        backoff = 0.1
                        if cut:
                            # The old queue and what it held went with the connection: neither
                            # the replay buffers nor the subscribers have what was published
                            # meanwhile (the new queue is bound: what follows arrives).
                            cut = False
                            self.buffers = ReplayBuffers()
                            if self.channels:
                                self.deliver([(channel, LOST) for channel in self.channels])
                        self._consume(connection)
            except Exception as exc:  # noqa: BLE001 - the listener outlives a broker that went away
                log.warning("live listener: %s: %s; reconnecting", type(exc).__name__, exc)
                cut = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _consume(self, connection: Any) -> None:
        ticks = 0
        while not self._stop.is_set():
            try:
                connection.drain_events(timeout=LISTEN_TICK_S)
                for _ in range(256):  # take what else is there before handing the batch on
                    connection.drain_events(timeout=0.0005)
            except TimeoutError:
                pass
            if self._batch:
                batch, self._batch = self._batch, []
                self.deliver(batch)
            ticks += 1
            if ticks % 500 == 0:
                self.buffers.expire()


__all__ = ["EXCHANGE", "AmqpBus", "AmqpListener"]
