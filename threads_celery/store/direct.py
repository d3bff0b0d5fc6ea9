"""The hot path's own statements on the driver's cursor (PostgreSQL).

A tool call runs at most three statements of its own (the read of the call and its run, the
claim for any effect but ``read_only``, the result commit) and a model step five (the read of
its run, the claim, the read of its history's new rows, ``tool_call_started``, a reply asking
for calls). Each is one statement, atomic by itself, and runs in autocommit. Through
SQLAlchemy's ``Connection`` each also paid for a pool checkout and checkin, two switches of the
isolation level and a column description of every column of the result: about 0.2 ms of CPU
per statement, several times what psycopg spends running it. Here they run on connections kept
for the purpose, already in autocommit, each with one raw cursor run again and again; their SQL
is SQLAlchemy's own compilation, rendered once with positional parameters (``$1``...), and their
parameter and result conversions are the dialect's, so a statement means exactly what it means
on the engine.

What is kept the same as on the engine:

* the connection is opened by the engine's pool (its URL, ``connect_args``, the dialect's
  set-up of the driver's JSON loading, ``prepare_threshold`` for a pooler);
* string parameters are made storable (:mod:`.storable`), and parameters never appear in an
  error (the engine runs with ``hide_parameters``);
* a server that is not there becomes :class:`~threads_celery.exceptions.StoreUnavailable`, any
  other database error the same SQLAlchemy exception the engine raises (``IntegrityError``...).

A connection belongs to one thread at a time: idle ones wait in a list, a busy thread opens
another. After a fork the parent's connections are left alone (closing them would end the
parent's sessions) and the child opens its own. SQLAlchemy's cursor events do not see these
statements.
"""

from __future__ import annotations

import os
import re
import select
import threading
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal, overload

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from threads_celery.records import storable_text
from threads_celery.store.availability import is_unreachable, store_unavailable, unreachable_as_store_unavailable
from threads_celery.store.storable import TEXTLESS, clean_parameters

#: Connections of a parent process, kept referenced in a forked child so that they are never
#: finalised there (the driver would end the parent's session on the shared socket).
_INHERITED: list[Any] = []


#: A bind parameter in SQLAlchemy's rendering for psycopg (``%(name)s``), and an escaped ``%``.
_PYFORMAT = re.compile(r"%\(([^)]+)\)s|%%")
_REQUIRED = object()


@dataclass(frozen=True)
class _Prepared:
    """A statement compiled once: its SQL and how its parameters and columns are converted."""

    sql: str  # with positional parameters ($1, $2...), run on a raw cursor
    #: For each position: the parameter's name, its default (or _REQUIRED) and its conversion.
    slots: tuple[tuple[str, Any, Callable[[Any], Any] | None], ...]
    names: tuple[str, ...] | None  # None: a text() statement, its columns unnamed
    result_processors: tuple[Callable[[Any], Any] | None, ...]


def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` rendered with ``%(name)s`` parameters, as ``$n`` ones; and the names by position.

    A name used twice keeps its one position.
    """
    order: list[str] = []

    def number(found: re.Match[str]) -> str:
        name = found.group(1)
        if name is None:
            return "%"
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PYFORMAT.sub(number, sql), tuple(order)


def _as_mapping(prepared: _Prepared, row: tuple[Any, ...]) -> dict[str, Any]:
    """A row of a ``select()`` by column name, its values converted as the engine converts them."""
    assert prepared.names is not None
    return {
        name: value if convert is None else convert(value)
        for name, value, convert in zip(prepared.names, row, prepared.result_processors, strict=True)
    }


#: How many of the engine's pooled connections a session may find ended before it takes one as is.
_STALE_POOLED_TRIES = 32


def _still_open(session: _Session | PoolProxiedConnection) -> bool:
    """Whether an idle connection's server end is still there, told without a round trip.

    An idle connection in autocommit has nothing to read unless its server ended it (a restart,
    a failover, an administrator): then its last words and the end of the stream wait in the
    socket. A readable socket is taken for such an end and the session closed, so a statement
    never goes out on it (what ``pool_pre_ping`` does for the engine, with a query).
    """
    driver = (session.connection if isinstance(session, _Session) else session).dbapi_connection
    if driver is None or driver.closed or driver.broken:
        return False
    try:
        readable, _, _ = select.select([driver.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class _Session:
    """One autocommit connection of the driver's, with the raw cursor its statements run on."""

    __slots__ = ("connection", "cursor")

    def __init__(self, connection: PoolProxiedConnection, cursor: Any) -> None:
        self.connection = connection
        self.cursor = cursor

    def close(self) -> None:
        with suppress(Exception):  # closing the connection closes its cursor anyway
            self.cursor.close()
        self.connection.close()


class DirectStatements:
    """Runs a few statements, each atomic on its own, on autocommit connections of the driver."""

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("the direct path runs on PostgreSQL only")
        self._engine = engine
        self._prepared: dict[int, tuple[ClauseElement, _Prepared]] = {}
        self._idle: list[_Session] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    # -- statements ------------------------------------------------------------------------

    def first(self, statement: ClauseElement, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first row of ``statement`` as a mapping by column name (None if it has none).

        A ``text()`` statement's columns are named by position ("0", "1"...).
        """
        prepared = self._prepare(statement)
        row = self._execute(prepared, params)
        if row is None:
            return None
        if prepared.names is None:
            return {str(i): value for i, value in enumerate(row)}
        return _as_mapping(prepared, row)

    def scalar(self, statement: ClauseElement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row of ``statement`` (None if it has no row)."""
        prepared = self._prepare(statement)
        row = self._execute(prepared, params)
        if row is None:
            return None
        convert = prepared.result_processors[0] if prepared.result_processors else None
        return row[0] if convert is None else convert(row[0])

    def rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every row of ``statement`` (a ``select()``), each a mapping by column name."""
        prepared = self._prepare(statement)
        if prepared.names is None:
            raise ValueError("rows() reads a select() statement, its columns named")
        return [_as_mapping(prepared, row) for row in self._execute(prepared, params, every=True)]

    def _prepare(self, statement: ClauseElement) -> _Prepared:
        # Keyed by identity, the statement held with its entry so that its id is never reused:
        # the statements run here are module-level constants, compiled once per process.
        known = self._prepared.get(id(statement))
        if known is not None and known[0] is statement:
            return known[1]
        dialect = self._engine.dialect
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        if "POSTCOMPILE" in compiled.string:
            raise ValueError("the direct path runs statements without expanding (IN list) parameters")
        sql, order = _positional(compiled.string)
        by_name = {compiled.bind_names.get(bind, key): bind for key, bind in compiled.binds.items()}
        # The dialect's own conversions, looked up as SQLAlchemy's compiler and result set do
        # (``_cached_*_processor``: the dialect's type behind a generic one, e.g. JSON).
        slots = tuple(
            (
                name,
                _REQUIRED if by_name[name].required else by_name[name].effective_value,
                by_name[name].type._cached_bind_processor(dialect),
            )
            for name in order
        )
        columns = getattr(statement, "selected_columns", None)
        prepared = _Prepared(
            sql=sql,
            slots=slots,
            names=None if columns is None else tuple(str(c.key) for c in columns),
            result_processors=()
            if columns is None
            else tuple(c.type._cached_result_processor(dialect, None) for c in columns),
        )
        self._prepared[id(statement)] = (statement, prepared)
        return prepared

    @staticmethod
    def _values(prepared: _Prepared, params: Mapping[str, Any]) -> list[Any]:
        values = []
        for name, default, processor in prepared.slots:
            value = params.get(name, default)
            if value is _REQUIRED:
                raise KeyError(f"statement parameter {name!r} is missing")
            if processor is not None:
                value = processor(value)
            kind = type(value)
            if kind is str:
                values.append(value if value.isascii() and "\x00" not in value else storable_text(value))
            else:
                values.append(value if kind in TEXTLESS else clean_parameters(value))
        return values

    # -- connections -----------------------------------------------------------------------

    @overload
    def _execute(self, prepared: _Prepared, params: Mapping[str, Any]) -> tuple[Any, ...] | None: ...

    @overload
    def _execute(self, prepared: _Prepared, params: Mapping[str, Any], *, every: Literal[True]) -> list[Any]: ...

    def _execute(self, prepared: _Prepared, params: Mapping[str, Any], *, every: bool = False) -> Any:
        """Run ``prepared`` with ``params``: its first row (None if none), or with ``every`` all
        its rows; driver errors become the engine's."""
        values = self._values(prepared, params)
        session = self._take()
        try:
            cursor = session.cursor
            cursor.execute(prepared.sql, values)
            found = cursor.fetchall() if every else cursor.fetchone()  # every statement here returns rows
        except self._dbapi().Error as exc:
            driver = session.connection.dbapi_connection
            gone = driver is None or bool(getattr(driver, "broken", False) or getattr(driver, "closed", False))
            if gone or (isinstance(exc, self._dbapi().OperationalError) and is_unreachable(exc)):
                self._discard(session, everyone=True)
                raise store_unavailable(self._engine.url, exc) from exc
            self._give_back(session)
            raise DBAPIError.instance(
                prepared.sql,
                None,
                exc,
                self._dbapi().Error,
                hide_parameters=True,
                dialect=self._engine.dialect,
            ) from exc
        except BaseException:
            self._discard(session, everyone=False)
            raise
        self._give_back(session)
        return found

    def _dbapi(self) -> Any:
        return self._engine.dialect.loaded_dbapi

    def _take(self) -> _Session:
        with self._lock:
            if self._pid != os.getpid():
                _INHERITED.extend(self._idle)
                self._idle = []
                self._pid = os.getpid()
            idle = self._idle.pop() if self._idle else None
        while idle is not None:
            if _still_open(idle):
                return idle
            idle.close()  # its server ended it; the next idle one is looked at the same way
            with self._lock:
                idle = self._idle.pop() if self._idle else None
        connection = self._pooled()
        # The engine's pool may hold connections its server ended too (it pings none): each is
        # invalidated, and the next one taken, until a live or a new one comes.
        for _ in range(_STALE_POOLED_TRIES):
            if _still_open(connection):
                break
            connection.invalidate()
            connection = self._pooled()
        driver = connection.dbapi_connection
        connection.detach()  # ours from now on: the pool opens another in its place
        assert driver is not None
        driver.autocommit = True
        # A raw cursor takes the $n parameters as rendered once per statement (no named-to-
        # positional conversion per run); it is kept with its connection and run again.
        return _Session(connection, self._dbapi().RawCursor(driver))

    def _pooled(self) -> PoolProxiedConnection:
        try:
            with unreachable_as_store_unavailable(self._engine.url):
                return self._engine.raw_connection()
        except self._dbapi().OperationalError as exc:
            # The pool hands back the driver's own error, not the engine's: a server that is
            # not there (yet) must still read as StoreUnavailable, which callers wait out.
            if is_unreachable(exc):
                raise store_unavailable(self._engine.url, exc) from exc
            raise

    def _give_back(self, session: _Session) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append(session)
                return
        if self._pid == os.getpid():
            session.close()

    def _discard(self, session: _Session, *, everyone: bool) -> None:
        """Close ``session``; with ``everyone``, the idle ones too (the server went away)."""
        with self._lock:
            others, self._idle = (self._idle, []) if everyone else ([], self._idle)
        for each in (session, *others):
            with suppress(Exception):  # it is broken already; nothing to keep
                each.close()

    def dispose(self) -> None:
        """Close the idle connections; later statements open new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
            same_process = self._pid == os.getpid()
        if same_process:
            for session in idle:
                session.close()
        else:
            _INHERITED.extend(idle)


__all__ = ["DirectStatements"]
