"""Telling "the database is not there" from "the statement is wrong".

:class:`~threads_celery.exceptions.StoreUnavailable` is the error callers may wait out and retry
(a worker keeps an executed tool's result and commits it once the server is back); any other
database error is a bug or a refusal and propagates as it is. This module is the one place
that draws the line and words the error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from threads_celery.exceptions import StoreUnavailable
from threads_celery.store.engine import safe_url

#: SQLSTATE classes that mean "the server is not there for now": connection exceptions (08),
#: operator intervention such as a shutdown or a restart in progress (57), too many
#: connections or out of resources (53).
UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")


def is_connection_error(exc: DBAPIError) -> bool:
    """Whether ``exc`` means the store is unreachable (try again), not that a query is wrong."""
    if exc.connection_invalidated:
        return True
    return exc.orig is not None and is_unreachable(exc.orig)


def is_unreachable(orig: BaseException) -> bool:
    """Whether the driver's own error ``orig`` means the server is not there (for now)."""
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate[:2] in UNAVAILABLE_SQLSTATE_CLASSES:
        return True
    text = str(orig).lower()
    return any(
        marker in text for marker in ("connection", "could not connect", "server closed", "terminating", "timeout")
    )


#: What a server that answered says when it refuses a login for a reason no wait will change: the
#: database or role does not exist, the password or the pg_hba.conf entry is wrong. (psycopg gives
#: no SQLSTATE for an error met while connecting, so the server's words are all there is.)
_LOGIN_REFUSALS = (
    "does not exist",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "password",
    "invalid dsn",
    "invalid connection option",
    "unsupported startup parameter",
)


def is_refused_for_good(exc: BaseException) -> bool:
    """Whether a failure to reach the database is one that waiting cannot fix.

    ``exc`` is the error a connection attempt raised, or one raised ``from`` it. A server that is
    down, restarting, starting up, out of connection slots or behind a broken link is worth
    waiting for; one that answered "no such database", "no such role" or "wrong password" is not.
    """
    seen: BaseException | None = exc
    while seen is not None:
        orig = getattr(seen, "orig", None) or seen
        sqlstate = getattr(orig, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate[:2] in ("28", "3D", "42"):
            return True  # invalid authorization, invalid catalog name, insufficient privilege
        text = str(orig).lower()
        if any(marker in text for marker in _LOGIN_REFUSALS):
            return True
        seen = seen.__cause__
    return False


def store_unavailable(url: URL | str, exc: BaseException) -> StoreUnavailable:
    """The error to raise (``from exc``) when the database at ``url`` did not answer.

    It names the database without its password and gives the driver's first line, never a
    statement's parameters.
    """
    orig = getattr(exc, "orig", None) or exc
    first_line = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return StoreUnavailable(f"cannot reach the database at {safe_url(url)}: {first_line}")


@contextmanager
def unreachable_as_store_unavailable(url: URL | str) -> Iterator[None]:
    """Inside, an OperationalError that means the server is not there becomes StoreUnavailable."""
    try:
        yield
    except OperationalError as exc:
        if is_connection_error(exc):
            raise store_unavailable(url, exc) from exc
        raise
