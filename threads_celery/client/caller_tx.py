"""Writing to the ledger in the caller's own database transaction (``start(within=...)``).

A web app saves its row and starts a run about it in one transaction of its own: the run, its
thread and its first step's outbox row are written on the caller's connection, so they commit
with the app's row or vanish with it. Nothing is sent to the broker before that commit: the
tasks go out once the commit is visible (watched for on a thread of its own), and if this process
dies between the commit and the send, the reconcile backbone finds the outbox row once its grace
has passed and sends it then. A rolled-back transaction sends nothing.

The caller's transaction is a SQLAlchemy ``Session`` or ``Connection`` on the store's own
database (its URL's host, port and database name must match the store's).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from threads_celery.exceptions import ConfigError
from threads_celery.store import Store, Tx

log = logging.getLogger("threads_celery.client")

#: What waits for each session's or connection's commit: (send, is it visible yet).
_PENDING: weakref.WeakKeyDictionary[Any, list[tuple[Callable[[], None], Callable[[Tx], bool]]]] = (
    weakref.WeakKeyDictionary()
)

#: The first and the longest pause between two looks for a commit the send waits on.
FIRST_LOOK_S = 0.002
LONGEST_LOOK_S = 0.25


class CallerTransaction:
    """The caller's open transaction: a :class:`Tx` on its connection, and what to do once it
    commits (or not, if it rolls back)."""

    def __init__(self, within: Any, store: Store) -> None:
        if isinstance(within, Session):
            self.connection = within.connection()
            self._session: Session | None = within
        elif isinstance(within, Connection):
            self.connection = within
            self._session = None
        else:
            raise TypeError(
                f"within= takes a SQLAlchemy Session or Connection in an open transaction, not {type(within).__name__}"
            )
        _check_same_database(self.connection, store)
        if not self.connection.in_transaction():
            raise ConfigError("within=: the connection has no transaction open (use engine.begin() or a Session)")
        self.store = store
        self.tx = Tx(self.connection, store)

    def after_commit(self, send: Callable[[], None], committed: Callable[[Tx], bool]) -> None:
        """Call ``send`` once the caller's transaction has committed (``committed`` reads, in a
        transaction of the store's, whether what it wrote is visible); never if it rolls back."""
        target: Any = self._session if self._session is not None else self.connection
        pending = _PENDING.get(target)
        if pending is None:
            pending = _PENDING[target] = []
            store = self.store

            def on_commit(*_: Any) -> None:
                due, pending[:] = list(pending), []
                for send_it, seen in due:
                    _send_once_visible(store, send_it, seen)

            def rolled_back(*_: Any) -> None:
                pending.clear()

            # Listened to once per session or connection, for all the starts in it. A
            # Connection's "commit" fires just before the database commits: the send waits, on
            # its own thread, until the rows are visible.
            names = ("after_commit", "after_rollback") if self._session is not None else ("commit", "rollback")
            event.listen(target, names[0], on_commit)
            event.listen(target, names[1], rolled_back)
        pending.append((send, committed))


def _send_once_visible(store: Store, send: Callable[[], None], committed: Callable[[Tx], bool]) -> None:
    """Send once ``committed`` sees the rows, on a thread of its own; give up after the step's
    grace, when the reconcile backbone sends what is left in the outbox."""
    deadline = time.monotonic() + store.step_grace.total_seconds()

    def watch() -> None:
        pause = FIRST_LOOK_S
        try:
            while True:
                with store.read() as tx:
                    if committed(tx):
                        break
                if time.monotonic() >= deadline:
                    log.info("a start in the caller's transaction is not visible yet: the backbone sends it")
                    return
                time.sleep(pause)
                pause = min(pause * 2, LONGEST_LOOK_S)
            send()
        except Exception as exc:  # noqa: BLE001 - the outbox keeps the task: the backbone sends it
            log.warning("sending after the caller's commit: %s: %s (the backbone sends it)", type(exc).__name__, exc)

    threading.Thread(target=watch, name="threads-send-after-commit", daemon=True).start()


def _check_same_database(connection: Connection, store: Store) -> None:
    theirs, ours = connection.engine.url, store.engine.url
    if theirs.get_backend_name() != ours.get_backend_name() or (theirs.host, theirs.port, theirs.database) != (
        ours.host,
        ours.port,
        ours.database,
    ):
        raise ConfigError(
            "within=: the transaction is on another database than the store's; a run is written in "
            "the caller's transaction only when the store lives in the same database"
        )


__all__ = ["CallerTransaction"]
