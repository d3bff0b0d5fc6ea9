"""Live messages on RabbitMQ, published from the caller's thread (plain ``amqp://``): on a
connection opened on a thread of its own, then non-blocking, so a publish is never waited for.
One the socket cannot take whole is dropped with its connection, and a later one connects again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.rabbitmq import rabbitmq_vhost
from tests.support.waiting import eventually
from threads_celery.live.amqp_bus import AmqpBus
from threads_celery.live.bus import Outgoing


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    with rabbitmq_vhost("threads-live-direct") as url:
        yield url


def _connected(bus: AmqpBus) -> AmqpBus:
    bus.prepare()
    eventually(lambda: bus._direct, timeout=30, what="the direct connection")
    return bus


def test_a_direct_publish_reaches_a_listening_process(amqp_url: str) -> None:
    bus = _connected(AmqpBus(amqp_url, ""))
    assert bus.direct
    received: list[tuple[str, bytes]] = []
    heard = threading.Event()

    def deliver(batch: list[tuple[str, bytes]]) -> None:
        received.extend(batch)
        heard.set()

    listener = bus.listen(deliver)
    listener.add("ch-1")
    try:
        # The listener's queue is bound on its own thread: publish until it hears one.
        def published_and_heard() -> bool:
            assert bus.send_now([Outgoing("ch-1", b"hello", "none")])
            return heard.wait(0.2)

        eventually(published_and_heard, timeout=30, what="a direct publish heard by the listener")
        assert ("ch-1", b"hello") in received
    finally:
        listener.close()


def test_a_publish_the_socket_cannot_take_is_dropped_and_the_bus_connects_again(amqp_url: str) -> None:
    bus = _connected(AmqpBus(amqp_url, ""))
    assert bus._direct is not None
    transport: Any = bus._direct[0].connection.transport

    def full(_data: bytes) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    transport._write = full  # the socket's buffer is full: the broker stopped reading
    assert bus.send_now([Outgoing("ch-2", b"lost", "none")]) is False  # dropped, not waited for
    assert bus._direct is None  # that connection is done for
    # A later publish finds a new connection (opened on its own thread, after a short pause).
    eventually(lambda: bus.send_now([Outgoing("ch-2", b"again", "none")]), timeout=30, what="a new connection")
    assert bus._direct is not None and bus._direct[0].connection.transport is not transport


def test_a_direct_publish_never_reads_from_the_socket(amqp_url: str) -> None:
    # On a non-blocking socket a frame half received would make py-amqp's reader spin: a
    # publish sends and returns, whatever the broker said meanwhile.
    bus = _connected(AmqpBus(amqp_url, ""))
    assert bus._direct is not None
    transport: Any = bus._direct[0].connection.transport
    reads: list[int] = []

    def read(n: int, initial: bool = False) -> bytes:
        reads.append(n)
        raise AssertionError("a direct publish read from the socket")

    transport._read = read
    assert all(bus.send_now([Outgoing("ch-3", b"m%d" % i, "none")]) for i in range(20))
    assert reads == []
