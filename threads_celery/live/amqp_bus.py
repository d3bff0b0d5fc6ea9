"""Live messages on RabbitMQ: a fanout exchange, one queue per subscribing process.

Workers publish every message, transient, to the fanout exchange ``threads.live`` (the channel as
the routing key, what it does to the replay buffer in a header). Each subscribing process binds
one exclusive, auto-deleted queue (bounded: the oldest are dropped past
:data:`QUEUE_MAX_LENGTH`, and a message older than a minute is dropped) and reads it on a thread
of its own (:class:`AmqpListener`).

The replay buffer lives in that process (:class:`~threads_celery.live.buffers.ReplayBuffers`,
bounded and expiring), fed by the fanout with the messages of every thread, not only of those
it streams: so a client reconnecting to any API process gets the step in progress from its start
(as long as that process was up when the step started). The price is that each API process
receives every thread's deltas; a fleet larger than that suits is what Redis is for.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from threads_celery.live.buffers import ReplayBuffers
from threads_celery.live.bus import Deliver, Outgoing

log = logging.getLogger("threads_celery.live.amqp_bus")

EXCHANGE = Exchange("threads.live", type="fanout", durable=False, auto_delete=False, delivery_mode=1)
QUEUE_MAX_LENGTH = 100_000
CONNECT_TIMEOUT_S = 0.5
LISTEN_TICK_S = 0.02


class AmqpBus:
    """Publishes on, and listens to, a RabbitMQ fanout exchange."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self._connection: Any = None
        self._producer: Any = None

    def send(self, batch: Sequence[Outgoing]) -> None:
        try:
            if self._producer is None:
                self._connection = Connection(self.url, connect_timeout=CONNECT_TIMEOUT_S)
                self._producer = Producer(self._connection.channel(), exchange=EXCHANGE)
                EXCHANGE(self._producer.channel).declare()
            for out in batch:
                self._producer.publish(
                    out.payload,
                    routing_key=out.channel,
                    headers={"op": out.buffer},
                    content_type="application/data",
                    content_encoding="binary",
                    delivery_mode=1,
                    retry=False,
                )
        except Exception:
            self._reset()
            raise

    def _reset(self) -> None:
        connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # releasing a broken connection
                connection.release()

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
                        self._consume(connection)
            except Exception as exc:  # noqa: BLE001 - the listener outlives a broker that went away
                log.warning("live listener: %s: %s; reconnecting", type(exc).__name__, exc)
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
