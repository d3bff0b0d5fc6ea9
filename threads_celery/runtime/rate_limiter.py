"""The shared one-minute windows of provider rate limits: Redis for a fleet, memory for one process.

:func:`rate_limiter_for` picks the store: none when ``THREADS_RATE_LIMITS`` is empty, Redis when
the broker is Redis (every worker of the fleet counts in the same keys), else an in-process window
(the embedded default, or a broker other than Redis: then each process keeps its own budget).
The decision (is the window full?) is :func:`threads_celery.decisions.provider_limits.window_is_full`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

import redis

from threads_celery.decisions.provider_limits import WINDOW_S, RateLimit, window_is_full, window_of

log = logging.getLogger("threads_celery.runtime.rate_limiter")
KEY_PREFIX = "threads:rate"


class RateLimiter(Protocol):
    """Takes a request from a provider's window, and counts the tokens a call used."""

    def acquire(self, provider: str, now: datetime) -> float | None:
        """None to go ahead (the request is counted), else the seconds to wait."""

    def spend_tokens(self, provider: str, tokens: int, now: datetime) -> None:
        """Count ``tokens`` against the provider's current window."""


class Unlimited:
    """No rate limits configured."""

    def acquire(self, provider: str, now: datetime) -> float | None:
        return None

    def spend_tokens(self, provider: str, tokens: int, now: datetime) -> None:
        return None


class LocalWindows:
    """Windows kept in this process (the embedded default)."""

    def __init__(self, limits: Mapping[str, RateLimit]) -> None:
        self.limits = dict(limits)
        self._counts: dict[tuple[str, int], list[int]] = {}
        self._lock = threading.Lock()

    def acquire(self, provider: str, now: datetime) -> float | None:
        limit = self.limits.get(provider)
        if limit is None:
            return None
        window, wait = window_of(now)
        with self._lock:
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= window}
            counts = self._counts.setdefault((provider, window), [0, 0])
            if window_is_full(limit, requests=counts[0] + 1, tokens=counts[1]):
                return wait
            counts[0] += 1
        return None

    def spend_tokens(self, provider: str, tokens: int, now: datetime) -> None:
        if provider not in self.limits or tokens <= 0:
            return
        window, _ = window_of(now)
        with self._lock:
            self._counts.setdefault((provider, window), [0, 0])[1] += tokens


class RedisWindows:
    """Windows in Redis, shared by every worker: ``threads:rate:<provider>:<window>:requests|tokens``."""

    def __init__(self, url: str, limits: Mapping[str, RateLimit]) -> None:
        self.url = url
        self.limits = dict(limits)
        self._client: Any = None
        self._lock = threading.Lock()

    def _redis(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)
            return self._client

    def acquire(self, provider: str, now: datetime) -> float | None:
        limit = self.limits.get(provider)
        if limit is None:
            return None
        window, wait = window_of(now)
        requests_key = f"{KEY_PREFIX}:{provider}:{window}:requests"
        tokens_key = f"{KEY_PREFIX}:{provider}:{window}:tokens"
        try:
            client = self._redis()
            pipe = client.pipeline()
            pipe.incr(requests_key)
            pipe.expire(requests_key, WINDOW_S * 2)
            pipe.get(tokens_key)
            requests, _, tokens = pipe.execute()
            if window_is_full(limit, requests=int(requests), tokens=int(tokens or 0)):
                client.decr(requests_key)
                return wait
        except Exception as exc:  # noqa: BLE001 - a limiter that cannot count must not stop the fleet
            log.warning(
                "rate limiter for %s unavailable, not limiting: %s: %s",
                provider,
                type(exc).__name__,
                exc,
            )
        return None

    def spend_tokens(self, provider: str, tokens: int, now: datetime) -> None:
        if provider not in self.limits or tokens <= 0:
            return
        window, _ = window_of(now)
        tokens_key = f"{KEY_PREFIX}:{provider}:{window}:tokens"
        try:
            pipe = self._redis().pipeline()
            pipe.incrby(tokens_key, tokens)
            pipe.expire(tokens_key, WINDOW_S * 2)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - see acquire
            log.warning(
                "rate limiter for %s could not count tokens: %s: %s",
                provider,
                type(exc).__name__,
                exc,
            )


def rate_limiter_for(limits: Mapping[str, RateLimit], broker_url: str | None) -> RateLimiter:
    """The limiter a runtime uses: none, Redis shared by the fleet, or this process's own."""
    if not limits:
        return Unlimited()
    if broker_url and broker_url.startswith(("redis://", "rediss://")):
        return RedisWindows(broker_url, limits)
    return LocalWindows(limits)


__all__ = ["LocalWindows", "RateLimiter", "RedisWindows", "Unlimited", "rate_limiter_for"]
