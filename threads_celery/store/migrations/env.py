"""Alembic environment: migrations run against the engine the caller hands over.

``threads_celery.store.migrate.upgrade(engine)`` (what ``threads-celery db upgrade`` runs) passes
its connection in; the plain ``alembic`` command, run from the repository root with its
``alembic.ini``, connects to ``THREADS_DATABASE_URL`` instead.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy.engine import Connection

from threads_celery.store.schema import metadata

config = context.config


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_from_the_command_line() -> None:
    from threads_celery.store import create_store_engine, parse_database_url

    if context.is_offline_mode():
        raise SystemExit("offline (--sql) migrations are not supported: run them against a database")
    url = os.environ.get("THREADS_DATABASE_URL")
    if not url:
        raise SystemExit(
            "THREADS_DATABASE_URL is not set: alembic reads the ledger's URL from it "
            "(or run `threads-celery db upgrade --database-url ...`)"
        )
    engine = create_store_engine(parse_database_url(url, source="THREADS_DATABASE_URL"))
    try:
        with engine.begin() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()


handed_over = config.attributes.get("connection")
if handed_over is not None:
    run_migrations(handed_over)
else:
    run_from_the_command_line()
