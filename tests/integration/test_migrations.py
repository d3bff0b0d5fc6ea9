"""The shipped migrations build exactly the schema the code declares, on PostgreSQL and SQLite.

Every migration is applied in order to an empty database, and the result is compared with
``threads_celery.store.schema.metadata`` by Alembic's autogenerate comparison: a column, index or
constraint added to one and not the other is a failure here, not a surprise in production.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from threads_celery.store import create_store_engine, parse_database_url
from threads_celery.store.migrate import alembic_config, current_revision, head_revision, upgrade
from threads_celery.store.schema import metadata


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on a brand-new, empty database of each backend."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = create_store_engine(parse_database_url(url))
    try:
        yield engine
    finally:
        engine.dispose()


def revisions_in_order() -> list[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def schema_differences(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(context, metadata)


def snapshot(engine: Engine) -> dict[str, Any]:
    """Tables, columns, indexes and the recorded revision: what a second upgrade must not touch."""
    inspector = inspect(engine)
    tables = sorted(inspector.get_table_names())
    with engine.connect() as conn:
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return {
        "version": version,
        "tables": {
            name: (
                [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(name)],
                sorted((i["name"], tuple(i["column_names"])) for i in inspector.get_indexes(name)),
            )
            for name in tables
        },
    }


def test_the_migrations_form_one_line_to_the_head() -> None:
    revisions = revisions_in_order()
    assert revisions, "no migrations shipped"
    assert revisions[-1] == head_revision()
    assert len(set(revisions)) == len(revisions)


def test_an_empty_database_has_no_revision(empty_engine: Engine) -> None:
    assert current_revision(empty_engine) is None
    # The comparison sees a missing schema: it is not vacuous.
    assert schema_differences(empty_engine)


def test_every_migration_applied_in_order_gives_the_declared_schema(empty_engine: Engine) -> None:
    for revision in revisions_in_order():
        upgrade(empty_engine, revision)
        assert current_revision(empty_engine) == revision
    assert current_revision(empty_engine) == head_revision()
    assert schema_differences(empty_engine) == []
    assert set(metadata.tables) <= set(inspect(empty_engine).get_table_names())


def test_upgrading_twice_is_a_no_op(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    first = snapshot(empty_engine)
    upgrade(empty_engine)
    assert snapshot(empty_engine) == first
    assert first["version"] == [head_revision()]
    assert schema_differences(empty_engine) == []


def test_a_second_upgrade_keeps_the_data(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    with empty_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agents (name, config_hash, description, updated_at) "
                "VALUES ('kept', 'abc', '{}', CURRENT_TIMESTAMP)"
            )
        )
    upgrade(empty_engine)
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM agents")).scalars().all() == ["kept"]


def test_on_postgresql_the_wide_columns_compress_their_large_values_with_lz4(pg_url: str) -> None:
    engine = create_store_engine(parse_database_url(pg_url))
    try:
        upgrade(engine)
        with engine.begin() as conn:
            if not conn.execute(
                text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
            ).scalar():
                pytest.skip("this PostgreSQL has no LZ4: migration 0010 leaves its columns as they are")
            methods = dict(
                conn.execute(
                    text(
                        "SELECT attrelid::regclass::text || '.' || attname, attcompression FROM pg_attribute "
                        "WHERE attrelid IN ('messages'::regclass, 'tool_calls'::regclass, 'events'::regclass) "
                        "AND attname IN ('text', 'parts', 'result', 'payload', 'run_id')"
                    )
                ).all()
            )
            assert methods["messages.text"] == methods["tool_calls.result"] == methods["events.payload"] == "l"
            assert methods["messages.run_id"] == ""  # an id keeps the server's default
            conn.execute(
                text(
                    "INSERT INTO threads (id, agent, config_hash, event_seq, created_at, tenant) "
                    "VALUES ('t-lz4', 'a', 'h', 0, now(), 'default')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO messages (thread_id, seq, role, text, created_at) "
                    "VALUES ('t-lz4', 0, 'tool', repeat('a wide tool result ', 2000), now())"
                )
            )
            stored = conn.execute(text("SELECT pg_column_compression(text) FROM messages WHERE thread_id = 't-lz4'"))
            assert stored.scalar() == "lz4"
    finally:
        engine.dispose()
