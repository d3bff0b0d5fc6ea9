"""Provider rate limits: waiting out a 429 or a 5xx, and keeping the fleet under a request and
token budget per minute.

- A provider that answers 429 (honouring ``Retry-After``), 408, 409, 425 or a 5xx is
  *transient*: the step is retried after the advised delay (else a capped
  exponential backoff) as a Celery retry with a countdown, so no worker slot is held meanwhile.
  Retries go on for ``THREADS_PROVIDER_RETRY_FOR_S`` seconds (default 600) from the step's first
  such failure; after that the run ends ``error`` with the provider's last answer as the reason.
  The first failure's time is kept in the thread's event log (``model_retry`` events), so the
  bound holds across workers and restarts.
- ``THREADS_RATE_LIMITS`` sets a budget per provider, as JSON: ``{"openai":
  {"requests_per_minute": 500, "tokens_per_minute": 200000}}``. Before each model call a worker
  takes a request from the provider's current one-minute window in Redis (shared by every worker
  of the fleet); a full window (requests, or tokens already used) makes the step wait for the
  next window, again as a retry with a countdown. Tokens are counted after each call.

Decisions here are pure functions (how long to wait, and when to give up, is
:func:`threads_celery.decisions.retry.decide_provider_retry`); :mod:`threads_celery.runtime.rate_limiter`
holds the Redis shell.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from threads_celery.exceptions import ConfigError

RATE_LIMITS_VARIABLE = "THREADS_RATE_LIMITS"
RETRY_FOR_VARIABLE = "THREADS_PROVIDER_RETRY_FOR_S"
DEFAULT_RETRY_FOR_S = 600.0
WINDOW_S = 60
#: HTTP statuses worth waiting out: throttling, timeouts, conflicts, and the provider's own faults.
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A provider's budget per minute, for the whole fleet (None: uncapped)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{RATE_LIMITS_VARIABLE}: {name} must be a positive whole number, not {value!r}")
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ConfigError(f"{RATE_LIMITS_VARIABLE}: set requests_per_minute, tokens_per_minute or both")


def rate_limits_from_json(raw: str) -> dict[str, RateLimit]:
    """``{"provider": {"requests_per_minute": n, "tokens_per_minute": n}}``; ConfigError on nonsense."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{RATE_LIMITS_VARIABLE} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{RATE_LIMITS_VARIABLE} must be a JSON object of provider -> limits")
    limits: dict[str, RateLimit] = {}
    for provider, value in data.items():
        if not isinstance(value, dict) or not set(value) <= {
            "requests_per_minute",
            "tokens_per_minute",
        }:
            raise ConfigError(
                f"{RATE_LIMITS_VARIABLE}: {provider!r} takes requests_per_minute and/or tokens_per_minute"
            )
        limits[str(provider)] = RateLimit(**value)
    return limits


def retry_for_from_env(raw: str | None) -> float:
    """``THREADS_PROVIDER_RETRY_FOR_S``: a positive, finite number of seconds."""
    if raw is None or not raw.strip():
        return DEFAULT_RETRY_FOR_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{RETRY_FOR_VARIABLE} must be a number of seconds, not {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{RETRY_FOR_VARIABLE} must be a positive number of seconds, not {raw!r}")
    return value


def provider_of(model_identity: str) -> str:
    """The provider part of a model identity: ``openai`` for ``openai:gpt-4o-mini``."""
    provider = model_identity.split(":", 1)[0] if ":" in model_identity else model_identity
    # "openai-chat:" and "openai-responses:" spend the same budget as "openai:".
    return provider.split("-", 1)[0] or "unknown"


# -- provider failures -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProviderFailure:
    """What a failed model call says about retrying: transient or not, and the advised delay."""

    transient: bool
    status: int | None = None
    retry_after_s: float | None = None


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """``Retry-After`` as seconds from ``now``: delta-seconds or an HTTP date; None if absent or bad."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            at = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        seconds = (at - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _headers_of(exc: BaseException) -> Mapping[str, str]:
    """Response headers from pydantic-ai's ModelHTTPError, or the SDK error it wraps."""
    for candidate in (exc, exc.__cause__):
        headers = getattr(candidate, "headers", None)
        if isinstance(headers, Mapping) and headers:
            return {str(k).lower(): str(v) for k, v in headers.items()}
        response = getattr(candidate, "response", None)
        response_headers = getattr(response, "headers", None)
        if response_headers is not None:
            try:
                return {str(k).lower(): str(v) for k, v in dict(response_headers).items()}
            except (TypeError, ValueError):
                continue
    return {}


def classify_provider_failure(exc: BaseException, now: datetime) -> ProviderFailure:
    """An HTTP answer worth waiting out (429, 408/409/425, 5xx), with its Retry-After, or not.

    Failures without an HTTP status (a dropped connection, a timeout, a reply that could not be
    read) are not classified here: they keep the step's attempt-based retries (``model_retries``).
    """
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return ProviderFailure(transient=False)
    transient = status in TRANSIENT_STATUSES or status >= 500
    retry_after = parse_retry_after(_headers_of(exc).get("retry-after"), now) if transient else None
    return ProviderFailure(transient=transient, status=status, retry_after_s=retry_after)


# -- the shared window -------------------------------------------------------------------------


def window_of(now: datetime) -> tuple[int, float]:
    """The one-minute window that holds ``now`` (its number) and the seconds until the next one."""
    epoch = now.timestamp()
    window = int(epoch // WINDOW_S)
    return window, (window + 1) * WINDOW_S - epoch


def window_is_full(limit: RateLimit, *, requests: int, tokens: int) -> bool:
    """Whether a window that already counts ``requests`` (this one included) and ``tokens`` is
    over the budget: the request would go past requests_per_minute, or the tokens are spent."""
    if limit.requests_per_minute is not None and requests > limit.requests_per_minute:
        return True
    return limit.tokens_per_minute is not None and tokens >= limit.tokens_per_minute


__all__ = [
    "ProviderFailure",
    "RateLimit",
    "classify_provider_failure",
    "parse_retry_after",
    "provider_of",
    "rate_limits_from_json",
    "retry_for_from_env",
    "window_is_full",
    "window_of",
]
