"""Which live bus a process uses: the one its broker URL names, one per broker and process."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from threads_celery.live.bus import LiveBus, MemoryBus

_buses: dict[tuple[str, str], LiveBus] = {}
_buses_lock = threading.Lock()


def bus_for(broker_url: str | None, database_url: str | None) -> LiveBus:
    """This process's bus for ``broker_url`` (one per broker, made on first use).

    The embedded default's in-process bus is one per database (two embedded ledgers in one
    process stay apart); Redis channels are prefixed with the broker's database number, since
    pub/sub spans a Redis server's databases.
    """
    url = (broker_url or "memory://").split(";")[0].strip()
    if url.startswith(("redis://", "rediss://")):
        key, namespace = (url, ""), urlsplit(url).path.strip("/") or "0"
    elif url.startswith(("amqp://", "amqps://", "pyamqp://")):
        key, namespace = (url, ""), ""
    else:
        namespace = database_url or ""
        key = ("memory://", namespace)
    with _buses_lock:
        bus = _buses.get(key)
        if bus is None:
            bus = _make_bus(url, namespace)
            _buses[key] = bus
        return bus


def _make_bus(url: str, namespace: str) -> LiveBus:
    if url.startswith(("redis://", "rediss://")):
        from threads_celery.live.redis_bus import RedisBus

        return RedisBus(url, namespace)
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        from threads_celery.live.amqp_bus import AmqpBus

        return AmqpBus(url, namespace)
    return MemoryBus(namespace)


__all__ = ["bus_for"]
