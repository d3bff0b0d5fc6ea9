"""An agent's row is written safely by processes that start together (worker, Beat, API).

Each registers the agents it loads: it reads the agent's row and inserts one when it read none.
Two starting at once both read none, and the second insert failed on the primary key
(``UniqueViolation`` on ``pk_agents``: the API did not start, seen in the README quick-start). The
insert a process makes after reading none must therefore succeed over a row inserted meanwhile,
writing its own definition, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from threads_celery.store import Store, create_store_engine, parse_database_url, statements
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import agents
from threads_celery.transitions.runs import utcnow


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'agents.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    ledger = Store(create_store_engine(parse_database_url(url)))
    upgrade(ledger.engine)
    yield ledger
    ledger.dispose()


def test_the_insert_after_reading_no_row_succeeds_over_a_row_inserted_meanwhile(store: Store) -> None:
    with store.transaction() as tx:  # the other process, first to commit
        tx.upsert_agent("nightly-report", "hash-a", {"v": "a"}, utcnow())
    with store.transaction() as tx:  # this one read no row before that commit: it inserts
        tx.conn.execute(
            statements.insert_agent(store.dialect),
            {
                "b_name": "nightly-report",
                "b_config_hash": "hash-b",
                "b_description": {"v": "b"},
                "b_updated_at": utcnow(),
            },
        )
    with store.read() as tx:
        rows = tx.conn.execute(select(agents.c.name, agents.c.config_hash, agents.c.description)).all()
    assert [(r.name, r.config_hash, r.description) for r in rows] == [("nightly-report", "hash-b", {"v": "b"})]


def test_registering_again_with_a_changed_definition_updates_the_row(store: Store) -> None:
    with store.transaction() as tx:
        tx.upsert_agent("nightly-report", "hash-a", {"v": "a"}, utcnow())
    with store.transaction() as tx:
        tx.upsert_agent("nightly-report", "hash-c", {"v": "c"}, utcnow())
    with store.read() as tx:
        assert tx.agent_hash("nightly-report") == "hash-c"
