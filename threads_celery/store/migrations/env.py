"""Alembic environment: migrations run against the engine the caller hands over."""

from __future__ import annotations

from alembic import context

from threads_celery.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")

if connection is None:
    raise RuntimeError("run migrations through threads_celery.store.migrate.upgrade(engine)")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
