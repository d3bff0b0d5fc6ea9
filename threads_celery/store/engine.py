"""Turning a database URL into a configured SQLAlchemy engine.

PostgreSQL goes through psycopg 3. SQLite (the embedded default) runs in WAL mode with a busy
timeout, and every transaction begins IMMEDIATE so that two writer threads queue on the lock
instead of failing on a read-to-write upgrade. On both, text the ledger cannot hold (NUL,
unpaired surrogates) is replaced at this boundary (see :mod:`.storable`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, create_engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from threads_celery.exceptions import ConfigError
from threads_celery.store import storable

SQLITE_BUSY_TIMEOUT_MS = 30_000


def parse_database_url(raw: str, *, source: str = "database URL") -> URL:
    """Validate and normalise a database URL; ConfigError names what is wrong."""
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{source} is empty")
    try:
        url = make_url(raw.strip())
    except ArgumentError:
        raise ConfigError(
            f"{source} is not a valid database URL (expected e.g. "
            "postgresql://user@host:5432/dbname or sqlite:///path/to/file.db)"
        ) from None
    backend = url.get_backend_name()
    if backend == "postgres":
        # postgres:// is what Heroku, Render, Fly and many a PaaS hand out; SQLAlchemy no longer
        # knows the name. It means postgresql://, and is read so.
        _, plus, driver = url.drivername.partition("+")
        url = url.set(drivername="postgresql" + plus + driver)
        backend = url.get_backend_name()
    if backend == "postgresql":
        if url.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
            url = url.set(drivername="postgresql+psycopg")
        if url.drivername != "postgresql+psycopg":
            raise ConfigError(f"{source}: use the psycopg 3 driver (postgresql+psycopg://)")
        if not url.database:
            raise ConfigError(f"{source} names no database")
        return url
    if backend == "sqlite":
        return url
    raise ConfigError(
        f"{source} uses {backend!r}; threads-celery stores in PostgreSQL or SQLite: write "
        "postgresql://user@host:5432/dbname or sqlite:///path/to/file.db"
    )


def safe_url(url: URL | str) -> str:
    """The URL with any password masked, for messages and logs."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return "<unparseable URL>"
    return url.render_as_string(hide_password=True)


def create_store_engine(url: URL, **overrides: Any) -> Engine:
    """An engine for ``url`` with the settings the ledger relies on."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, **overrides)
    url, prepare_threshold = _prepare_threshold(url)
    options: dict[str, Any] = {
        "pool_pre_ping": False,
        "pool_size": 5,
        "max_overflow": 10,
        "connect_args": {"connect_timeout": 5, "prepare_threshold": prepare_threshold},
        "json_serializer": storable.dumps,
        # Parameters are conversation text and tool arguments: never in logs or error messages.
        "hide_parameters": True,
    }
    options.update(overrides)
    engine = create_engine(url, **options)
    storable.install(engine)
    return engine


#: psycopg's default: a statement is prepared on the server after its fifth execution.
DEFAULT_PREPARE_THRESHOLD = 5


def _prepare_threshold(url: URL) -> tuple[URL, int | None]:
    """The URL without our ``prepare_threshold`` option, and the option's value.

    ``?prepare_threshold=none`` turns psycopg's server-side prepared statements off, for a pooler
    in transaction mode that does not track them (PgBouncer before 1.21, or with
    ``max_prepared_statements = 0``): there a statement prepared on one server connection is run
    on another ("prepared statement _pg3_0 does not exist").
    """
    raw = url.query.get("prepare_threshold")
    if raw is None:
        return url, DEFAULT_PREPARE_THRESHOLD
    value = raw[-1] if isinstance(raw, tuple) else raw
    if value.strip().lower() in ("none", "off", "false"):
        threshold = None
    else:
        try:
            threshold = int(value)
        except ValueError:
            raise ConfigError(
                f"prepare_threshold in the database URL must be a whole number or 'none', not {value!r}"
            ) from None
        if threshold < 0:
            raise ConfigError(f"prepare_threshold in the database URL must not be negative, not {threshold}")
    return url.difference_update_query(["prepare_threshold"]), threshold


def _sqlite_engine(url: URL, **overrides: Any) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": 30},
        "json_serializer": storable.dumps,
        "hide_parameters": True,
    }
    if database in ("", ":memory:"):
        # One shared connection, or every thread would see its own empty database.
        options["poolclass"] = StaticPool
    options.update(overrides)
    engine = create_engine(url, **options)
    storable.install(engine)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE below is the only BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        readonly = connection.get_execution_options().get("threads_readonly", False)
        connection.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine
