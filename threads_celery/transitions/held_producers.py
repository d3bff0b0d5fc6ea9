"""Producers for the publisher's own sends on Redis, each keeping one Redis client.

kombu's Redis channel builds a new ``redis.Redis`` for every command it sends (the task
message's ``LPUSH``, the ``task-sent`` event's ``PUBLISH``), and redis-py builds the client's
table of about 170 response callbacks in each constructor: about a quarter of the CPU a publish
costs here (``bench/RESULTS.md``). A client holds no state of its own beyond that table and
its connection pool (each command checks a connection out of the pool and gives it back), so
one client per channel, built again only when the channel's pool is replaced, sends exactly the
same commands.

Only the publisher's producers use this transport; what Celery itself sends and consumes (the
worker's consumer, acknowledgements, a task's retry) keeps kombu's own. Any other broker, and
Redis through Sentinel, publishes through Celery's producer pool as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any
from urllib.parse import urlparse

from celery import Celery
from kombu import Connection, Producer
from kombu.transport import redis as kombu_redis

#: The URL schemes this transport serves (plain Redis and Redis over TLS).
REDIS_SCHEMES = frozenset({"redis", "rediss"})


class HeldClientChannel(kombu_redis.Channel):
    """A kombu Redis channel that builds its synchronous client once per connection pool."""

    _held_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]  # not in kombu's stubs
        held = self._held_client
        if held is None or held.connection_pool is not self.pool:
            held = self._held_client = super()._create_client()  # type: ignore[misc]  # not in kombu's stubs
        return held


class HeldClientTransport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`HeldClientChannel` channels."""

    Channel = HeldClientChannel


def serves(broker_url: str) -> bool:
    """Whether every URL of ``broker_url`` (``;`` separates failover URLs) is plain Redis."""
    urls = [url for url in broker_url.split(";") if url.strip()]
    return bool(urls) and all(urlparse(url.strip()).scheme in REDIS_SCHEMES for url in urls)


class ProducerStack:
    """Producers on :class:`HeldClientTransport` connections, taken one per send.

    A producer serves one send at a time (kombu's producers and channels are not thread-safe):
    threads that publish at the same time each take one, and an idle one waits for the next
    send. A forked child starts with none and leaves its parent's connections alone.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._idle: list[tuple[Connection, Producer]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def take(self) -> tuple[Connection, Producer]:
        """An idle producer and its connection, or a new one (connected on its first send)."""
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._pid = [], os.getpid()  # the parent's: not ours to close
            if self._idle:
                return self._idle.pop()
        connection = self.app.connection_for_write(transport=HeldClientTransport)
        return connection, self.app.amqp.Producer(connection)

    def give_back(self, held: tuple[Connection, Producer]) -> None:
        """Keep a producer whose send went through for the next send."""
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append(held)
        # Taken before a fork and given back after it: the connection is the parent's.

    @staticmethod
    def discard(held: tuple[Connection, Producer]) -> None:
        """Close a producer's connection (after a failed send it may be broken)."""
        with contextlib.suppress(Exception):  # closing a broken connection may fail too
            held[0].close()

    def close(self) -> None:
        """Close the idle producers' connections: for when this process publishes no more."""
        with self._lock:
            idle, self._idle = self._idle, []
            ours = self._pid == os.getpid()
        if ours:
            for held in idle:
                self.discard(held)
