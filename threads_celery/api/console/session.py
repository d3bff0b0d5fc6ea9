"""Signing in to the console: an API token exchanged for a signed session cookie, and CSRF tokens.

A browser cannot send ``Authorization: Bearer`` with a page load or an ``EventSource``, so the
console signs in once with a token from ``THREADS_API_TOKENS`` and keeps a cookie instead. The
cookie never holds the token: it holds the moment it was issued and an HMAC of that moment keyed
by the token (:func:`issue`). Each request finds the token whose HMAC matches (every token is
tried, in constant time each), and with it the caller: its principal and tenant, exactly as
``/v1`` would answer that token. A token removed from ``THREADS_API_TOKENS`` ends its sessions;
a session older than its lifetime ends too, and either sends the browser back to sign in.

Every form that changes something carries a CSRF token, an HMAC of the session keyed by the
same token (:func:`csrf_token`); the cookie is also ``SameSite=Strict`` and ``HttpOnly``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

from threads_celery.api.tenancy import Caller

COOKIE = "threads_console"
#: How long a session lasts after sign-in.
DEFAULT_SESSION_S = 12 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: who it acts as, and the value its forms' CSRF tokens derive from."""

    caller: Caller
    csrf: str


def _mac(token: str, purpose: str, issued: int) -> str:
    return hmac.new(token.encode(), f"threads-console:{purpose}:{issued}".encode(), hashlib.sha256).hexdigest()


def issue(token: str, *, now: float | None = None) -> str:
    """The cookie value of a session signed in with ``token``. Pure but for the clock."""
    issued = int(time.time() if now is None else now)
    return f"{issued}.{_mac(token, 'session', issued)}"


def verify(
    cookie: str | None, callers: Mapping[str, Caller], *, lifetime_s: float, now: float | None = None
) -> Session | None:
    """The session a cookie holds, or None: malformed, expired, or signed by no current token."""
    if not cookie or "." not in cookie or len(cookie) > 200:
        return None
    raw_issued, _, mac = cookie.partition(".")
    if not (raw_issued.isascii() and raw_issued.isdigit()) or len(raw_issued) > 12:
        return None
    issued = int(raw_issued)
    at = time.time() if now is None else now
    if issued > at + 60 or at - issued > lifetime_s:
        return None
    found: Session | None = None
    for token, caller in callers.items():
        if hmac.compare_digest(mac.encode(), _mac(token, "session", issued).encode()):
            found = Session(caller, _mac(token, "csrf", issued))
    return found


def caller_of_token(token: str, callers: Mapping[str, Caller]) -> str | None:
    """The configured token equal to ``token`` (compared with every one, in constant time)."""
    found: str | None = None
    for known in callers:
        if hmac.compare_digest(token.encode(), known.encode()):
            found = known
    return found


def csrf_ok(session: Session, given: str | None) -> bool:
    """Whether a form's CSRF token is this session's."""
    return given is not None and hmac.compare_digest(given.encode(), session.csrf.encode())


__all__ = ["COOKIE", "DEFAULT_SESSION_S", "Session", "caller_of_token", "csrf_ok", "issue", "verify"]
