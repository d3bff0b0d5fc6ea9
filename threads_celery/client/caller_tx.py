"""Writing to the ledger in the caller's own database transaction (``start(within=...)``).

A web app saves its row and starts a run about it in one transaction of its own: the run, its
thread and its first step's outbox row are written on the caller's connection, so they commit
with the app's row or vanish with it. Nothing is sent to the broker before that commit: the
tasks go out once the commit is visible (watched for on a thread of its own), and if this process
dies between the commit and the send, the reconcile backbone finds the outbox row once its grace
has passed and sends it then. A rolled-back transaction sends nothing.

The caller's transaction is, on the store's own database:

- a SQLAlchemy ``Session`` or ``Connection`` (its URL's host, port and database name must match
  the store's); the send waits for its commit event;
- a psycopg 3 connection in a transaction (``with conn.transaction():``, or a connection out of
  autocommit); psycopg has no commit hook, so the send watches for the commit from the start;
- Django's connection (``django.db.connection``, or ``connections[alias]``) inside
  ``transaction.atomic()``; the send is Django's ``on_commit`` callback, and a rolled-back
  atomic block (or savepoint) drops it with the rows.

A psycopg connection, Django's included, is lent to SQLAlchemy for the writes (see
:func:`_borrowing_engine`): the ledger's statements run on it exactly as on the store's own,
and nothing here ever commits, rolls back or closes it. For those, "the same database" is
checked on the server itself (its database, port and start time), since the connection carries
no URL to compare.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import set_json_dumps, set_json_loads
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from threads_celery.exceptions import ConfigError
from threads_celery.store import Store, Tx, storable

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
        self.store = store
        self._session: Session | None = None
        #: Django's ``on_commit`` for its connection: the caller's own commit hook.
        self._on_commit: Callable[[Callable[[], None]], None] | None = None
        #: The SQLAlchemy connection lent a psycopg connection of the caller's (closed once written).
        self._borrowed: Connection | None = None
        if isinstance(within, Session):
            self.connection = within.connection()
            self._session = within
        elif isinstance(within, Connection):
            self.connection = within
        elif _is_django_connection(within):
            raw = _django_psycopg_connection(within)
            self.connection = self._borrowed = borrowed_connection(raw, store)
            _check_same_server(self.connection, store)
            self._on_commit = lambda send: within.on_commit(send, robust=True)
        elif isinstance(within, psycopg.Connection):
            _check_psycopg_transaction(within)
            self.connection = self._borrowed = borrowed_connection(within, store)
            _check_same_server(self.connection, store)
        else:
            raise TypeError(
                "within= takes a SQLAlchemy Session or Connection, a psycopg connection or Django's "
                f"connection, in an open transaction, not {type(within).__name__}"
            )
        if self._borrowed is None:
            _check_same_database(self.connection, store)
            if not self.connection.in_transaction():
                raise ConfigError("within=: the connection has no transaction open (use engine.begin() or a Session)")
        self.tx = Tx(self.connection, store)

    def after_commit(self, send: Callable[[], None], committed: Callable[[Tx], bool]) -> None:
        """Call ``send`` once the caller's transaction has committed (``committed`` reads, in a
        transaction of the store's, whether what it wrote is visible); never if it rolls back."""
        if self._borrowed is not None:
            self._borrowed.close()  # the lent connection: nothing of the caller's is ended
            if self._on_commit is not None:  # Django: its own hook, run after the commit
                self._on_commit(lambda: _send_now(send))
            else:  # psycopg: no hook; watch for the commit from now on
                _send_once_visible(self.store, send, committed)
            return
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


def _send_now(send: Callable[[], None]) -> None:
    """Send what a commit that has happened made due; a failure is left to the backbone."""
    try:
        send()
    except Exception as exc:  # noqa: BLE001 - the outbox keeps the task: the backbone sends it
        log.warning("sending after the caller's commit: %s: %s (the backbone sends it)", type(exc).__name__, exc)


class _Lent:
    """A psycopg connection of the caller's as SQLAlchemy's pool sees it: every call goes to the
    connection, except the ones that would end the caller's transaction or connection.

    SQLAlchemy rolls a connection back when it first meets it (after reading the server's
    version) and when it is given back; the caller's transaction is not its to end. Cursors are
    psycopg's own server-side-binding ones (a Django connection makes client-side ones) with the
    store's JSON dumping and loading (Django loads ``jsonb`` as text), as on the store's engine.
    """

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        # A named (server-side) cursor, asked for with arguments, is the connection's own kind.
        cursor = self._connection.cursor(*args, **kwargs) if args or kwargs else psycopg.Cursor(self._connection)
        set_json_dumps(storable.dumps, cursor)
        set_json_loads(json.loads, cursor)
        return cursor

    def commit(self) -> None:
        """Never: the caller commits."""

    def rollback(self) -> None:
        """Never: the caller rolls back."""

    def close(self) -> None:
        """Never: the connection stays the caller's."""

    def add_notice_handler(self, handler: Any) -> None:
        """Never: the dialect adds one at each connect, and the caller's notices are its own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


#: The caller's connection that the borrowing engine's pool hands out next (set for one checkout).
_LENDING: ContextVar[psycopg.Connection[Any] | None] = ContextVar("threads_lending", default=None)
#: Each store's borrowing engine: made once, so that the dialect reads the server once and every
#: statement is compiled once, as on the store's own engine.
_BORROWING: weakref.WeakKeyDictionary[Store, Engine] = weakref.WeakKeyDictionary()


def _lend() -> _Lent:
    connection = _LENDING.get()
    if connection is None:  # only borrowed_connection checks out of this engine
        raise RuntimeError("the borrowing engine connects only to a caller's connection")
    return _Lent(connection)


def _borrowing_engine(store: Store) -> Engine:
    """The store's engine for callers' connections: configured as the store's own (JSON, storable
    text, parameters kept out of errors), its pool a ``NullPool`` whose every connection is the
    caller's of the moment, wrapped so that "closing" it when it is given back ends nothing, and
    with no reset on return."""
    engine = _BORROWING.get(store)
    if engine is None:
        engine = create_engine(
            store.engine.url,
            creator=_lend,
            poolclass=NullPool,
            pool_reset_on_return=None,
            use_native_hstore=False,  # its set-up needs psycopg's own connection class; the ledger has no hstore
            json_serializer=storable.dumps,
            hide_parameters=True,
        )
        storable.install(engine)
        _BORROWING[store] = engine
    return engine


def borrowed_connection(connection: psycopg.Connection[Any], store: Store) -> Connection:
    """A SQLAlchemy connection over the caller's psycopg connection that never commits, rolls
    back or closes it (see :func:`_borrowing_engine`)."""
    if store.dialect != "postgresql":
        raise ConfigError(
            "within=: the transaction is on another database than the store's; a run is written in "
            "the caller's transaction only when the store lives in the same database"
        )
    lending = _LENDING.set(connection)
    try:
        borrowed = _borrowing_engine(store).connect()
    finally:
        _LENDING.reset(lending)
    borrowed.begin()  # SQLAlchemy's bookkeeping only: psycopg is already in the caller's transaction
    return borrowed


def _check_psycopg_transaction(connection: psycopg.Connection[Any]) -> None:
    status = connection.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise ConfigError("within=: the psycopg connection's transaction has failed (roll it back first)")
    if status != TransactionStatus.INTRANS and (connection.autocommit or status != TransactionStatus.IDLE):
        raise ConfigError(
            "within=: the psycopg connection has no transaction open (use `with conn.transaction():`, "
            "or a connection out of autocommit)"
        )


def _is_django_connection(within: Any) -> bool:
    """Django's ``DatabaseWrapper`` or the ``django.db.connection`` proxy, told apart without
    importing Django (an optional dependency)."""
    return type(within).__module__.startswith("django.") and hasattr(within, "in_atomic_block")


def _django_psycopg_connection(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg connection under Django's, inside an atomic block; ConfigError otherwise."""
    alias = getattr(connection, "alias", "default")
    if connection.vendor != "postgresql":
        raise ConfigError(
            f"within=: Django's {alias!r} database is {connection.vendor}; a run is written in its "
            "transaction only when the store lives in the same PostgreSQL database"
        )
    if not connection.in_atomic_block:
        raise ConfigError(
            "within=connection: Django's connection is in autocommit here; start the run inside "
            "`with transaction.atomic():` so that it commits with your rows"
        )
    if connection.needs_rollback:
        raise ConfigError("within=connection: the atomic block is marked for rollback (an error happened in it)")
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise ConfigError(
            f"within=connection: Django's {alias!r} database runs on {type(raw).__module__}; a run is "
            "written in its transaction with psycopg 3 only (pip install 'psycopg[binary]')"
        )
    return raw


#: A server's database, port and start time: the same through any host name, socket or pooler.
_SERVER_IDENTITY = text("SELECT current_database(), current_setting('port'), pg_postmaster_start_time()")
#: Each store's identity, read once.
_STORE_IDENTITY: weakref.WeakKeyDictionary[Store, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def _check_same_server(borrowed: Connection, store: Store) -> None:
    """The caller's connection and the store's reach the same database of the same server."""
    theirs = tuple(borrowed.execute(_SERVER_IDENTITY).one())
    ours = _STORE_IDENTITY.get(store)
    if ours is None:
        with store.read() as tx:
            ours = _STORE_IDENTITY[store] = tuple(tx.conn.execute(_SERVER_IDENTITY).one())
    if theirs != ours:
        borrowed.close()
        raise ConfigError(
            f"within=: the transaction is on another database ({theirs[0]!r}) than the store's "
            f"({ours[0]!r}); a run is written in the caller's transaction only when the store lives "
            "in the same database"
        )


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
