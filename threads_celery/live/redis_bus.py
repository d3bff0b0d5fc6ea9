"""Live messages on the broker's Redis: PUBLISH for the live ones, a capped list for replay.

The worker's sender sends a batch in one pipelined round trip: each message is PUBLISHed on its
channel and, unless it is a nudge, written to the channel's replay list (``<channel>:replay``):
RPUSH, LTRIM to :data:`~threads_celery.live.buffers.MAX_MESSAGES`, EXPIRE after
:data:`~threads_celery.live.buffers.TTL_S`; the first message of a step attempt replaces the
list, its end deletes it. Its client times out in a quarter of a second: a Redis that does not
answer costs the sender thread that, never the model turn (see :mod:`.sender`).

A subscribing process holds one pub/sub connection (:class:`RedisListener`), on a thread of its
own, and SUBSCRIBEs to a channel while some local subscriber wants it. Adding a channel returns
once Redis confirmed the SUBSCRIBE, so that a replay read after it misses nothing published in
between; a connection made again after a failure tells each channel's subscribers that messages
may have been lost meanwhile (:data:`~threads_celery.live.wire.LOST`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from threads_celery.live.buffers import MAX_MESSAGES, TTL_S
from threads_celery.live.bus import Deliver, Outgoing
from threads_celery.live.redis_direct import DirectRedis, resp
from threads_celery.live.wire import LOST

log = logging.getLogger("threads_celery.live.redis_bus")

SOCKET_TIMEOUT_S = 0.25
#: How long the listener waits for a message before it looks at its channel requests.
LISTEN_TICK_S = 0.02
#: How long adding a channel waits for Redis to confirm the SUBSCRIBE.
ADD_WAIT_S = 1.0


TRIM_FROM = b"-%d" % MAX_MESSAGES
TTL_TEXT = b"%d" % int(TTL_S)


def replay_key(channel: str) -> str:
    return f"{channel}:replay"


class RedisBus:
    """Publishes on, and listens to, the broker's Redis."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self._client: redis.Redis | None = None
        self._direct: DirectRedis | None = None
        self._commands: dict[str, tuple[bytes, bytes, bytes, bytes, bytes]] = {}
        #: Whether messages are written at once from the caller's thread (plain ``redis://``).
        self.direct = url.startswith("redis://")

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
            )
        return self._client

    def prepare(self) -> None:
        """Open the non-blocking connection now, on a thread of its own (a worker's sender calls
        this when it starts: the connection is up before its first delta)."""
        if self.direct and self._direct is None:
            self._direct = DirectRedis(self.url)
            self._direct.connect_soon()

    def send_now(self, batch: Sequence[Outgoing]) -> bool:
        """Write ``batch`` at once on the non-blocking connection (``redis://``); False: dropped."""
        if self._direct is None:
            self.prepare()
        assert self._direct is not None
        commands: list[bytes] = []
        for out in batch:
            known = self._commands.get(out.channel)
            if known is None:
                known = self._commands_of(out.channel)
            publish, rpush, trim, expire, delete = known
            bulk = b"$%d\r\n%s\r\n" % (len(out.payload), out.payload)
            commands += (publish, bulk)
            if out.buffer == "none":
                continue
            if out.buffer != "append":  # reset or clear
                commands.append(delete)
            if out.buffer != "clear":
                commands += (rpush, bulk, trim, expire)
        return self._direct.write(commands)

    def _commands_of(self, channel: str) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """A channel's commands, encoded once (the payload's bulk string follows PUBLISH and RPUSH)."""
        name = channel.encode()
        key = name + b":replay"
        known = (
            resp(b"PUBLISH", name).replace(b"*2\r\n", b"*3\r\n", 1),
            resp(b"RPUSH", key).replace(b"*2\r\n", b"*3\r\n", 1),
            resp(b"LTRIM", key, TRIM_FROM, b"-1"),
            resp(b"EXPIRE", key, TTL_TEXT),
            resp(b"DEL", key),
        )
        if len(self._commands) >= 4096:  # bounded: one entry per thread streamed lately
            self._commands.clear()
        self._commands[channel] = known
        return known

    def send(self, batch: Sequence[Outgoing]) -> None:
        pipe = self._redis().pipeline(transaction=False)
        for out in batch:
            pipe.publish(out.channel, out.payload)
            key = replay_key(out.channel)
            if out.buffer == "clear":
                pipe.delete(key)
            elif out.buffer in ("append", "reset"):
                if out.buffer == "reset":
                    pipe.delete(key)
                pipe.rpush(key, out.payload)
                pipe.ltrim(key, -MAX_MESSAGES, -1)
                pipe.expire(key, int(TTL_S))
        pipe.execute()

    def listen(self, deliver: Deliver) -> RedisListener:
        return RedisListener(self, deliver)


class RedisListener:
    """One pub/sub connection for the process, on its own thread."""

    def __init__(self, bus: RedisBus, deliver: Deliver) -> None:
        self.bus = bus
        self.deliver = deliver
        # A connection of its own, without the socket timeout: it waits for messages.
        self._client = redis.Redis.from_url(bus.url, socket_connect_timeout=2.0, health_check_interval=30)
        self._replay_client = redis.Redis.from_url(bus.url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._requests: queue.SimpleQueue[tuple[str, str, threading.Event | None]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="threads-live-redis", daemon=True)
        self._thread.start()

    def add(self, channel: str) -> None:
        """Subscribe to ``channel``; returns once Redis confirmed it (or after a second)."""
        sent = threading.Event()
        self._requests.put(("subscribe", channel, sent))
        sent.wait(ADD_WAIT_S)

    def remove(self, channel: str) -> None:
        self._requests.put(("unsubscribe", channel, None))

    def replay(self, channel: str) -> list[bytes]:
        try:
            # redis-py types lrange for its sync and async clients alike (a union with an Awaitable):
            found: list[bytes] = self._replay_client.lrange(replay_key(channel), 0, -1)  # type: ignore[assignment]
        except redis.RedisError as exc:
            log.warning("live replay of %s unavailable: %s", channel, exc)
            return []
        return found

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._client.close()
        self._replay_client.close()

    def _run(self) -> None:
        pubsub: Any = None
        channels: set[str] = set()
        #: Per channel, the adders waiting for Redis to confirm its SUBSCRIBE.
        waiting: dict[str, list[threading.Event]] = {}
        backoff = 0.1
        cut = False
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    # Typed here: redis-py before 8 leaves Redis.pubsub unannotated.
                    make_pubsub: Callable[..., Any] = self._client.pubsub
                    pubsub = make_pubsub()
                    if channels:
                        pubsub.subscribe(*channels)
                    if cut and channels:
                        # Messages published while it was cut never came: say so.
                        self.deliver([(channel, LOST) for channel in channels])
                    cut = False
                self._apply_requests(pubsub, channels, waiting)
                if not channels:
                    time.sleep(LISTEN_TICK_S)
                    continue
                batch: list[tuple[str, bytes]] = []
                message = pubsub.get_message(timeout=LISTEN_TICK_S)
                while message is not None:
                    kind = message.get("type")
                    channel = message.get("channel")
                    channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                    if kind == "message":
                        batch.append((channel, message["data"]))
                    elif kind == "subscribe":
                        for added in waiting.pop(channel, ()):
                            added.set()
                    if len(batch) >= 512:
                        break
                    message = pubsub.get_message(timeout=0)
                if batch:
                    self.deliver(batch)
                backoff = 0.1
            except Exception as exc:  # noqa: BLE001 - the listener outlives a Redis that went away
                log.warning("live listener: %s: %s; reconnecting", type(exc).__name__, exc)
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        pubsub.close()
                pubsub = None
                cut = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        if pubsub is not None:
            pubsub.close()

    def _apply_requests(self, pubsub: Any, channels: set[str], waiting: dict[str, list[threading.Event]]) -> None:
        while True:
            try:
                action, channel, added = self._requests.get_nowait()
            except queue.Empty:
                return
            if action == "subscribe" and channel not in channels:
                channels.add(channel)
                pubsub.subscribe(channel)
                if added is not None:
                    waiting.setdefault(channel, []).append(added)
            elif added is not None and channel in waiting:
                waiting[channel].append(added)  # its confirmation is on its way
            elif added is not None:
                added.set()  # confirmed already
            if action == "unsubscribe" and channel in channels:
                channels.discard(channel)
                for adder in waiting.pop(channel, ()):
                    adder.set()
                pubsub.unsubscribe(channel)


__all__ = ["RedisBus", "RedisListener", "replay_key"]
