"""A run started in the caller's own transaction (``start(within=...)``), on PostgreSQL with a
real worker on Redis: it commits with the app's row or vanishes with it, is sent once, after the
commit, and a process that dies between its commit and the send leaves it to Beat's backbone.

The app's table (``orders``) lives in the store's database, beside the ledger's tables, as a web
app's would.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from tests.integration import agents_for_tests as agents
from tests.support.processes import BeatProcess, WorkerProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery.exceptions import ConfigError

pytestmark = pytest.mark.integration

WAIT_S = 60.0
ORDERS = sa.Table(
    "app_orders", sa.MetaData(), sa.Column("id", sa.String(64), primary_key=True), sa.Column("run_id", sa.String(64))
)


@pytest.fixture(scope="module")
def app_engine(migrated_pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    ORDERS.create(engine, checkfirst=True)
    yield engine
    engine.dispose()


@pytest.fixture
def sent(threads: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The outbox keys the client hands to the broker, in order."""
    keys: list[str] = []
    publisher = type(threads.publisher)
    publish = publisher.__call__

    def recording(self: Any, entries: Any) -> Any:
        if self is threads.publisher:
            keys.extend(e.key for e in entries)
        return publish(self, entries)

    monkeypatch.setattr(publisher, "__call__", recording)
    return keys


def order_id() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


def orders(engine: sa.Engine, oid: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(ORDERS).where(ORDERS.c.id == oid)))


def test_a_run_started_in_a_session_that_commits_runs_once_after_the_commit(
    threads: Any, app_engine: sa.Engine, sent: list[str]
) -> None:
    oid = order_id()
    with Session(app_engine) as session, session.begin():
        session.execute(sa.insert(ORDERS).values(id=oid))
        handle = threads.start(agents.one_step, f"about {oid}", within=session)
        session.execute(sa.update(ORDERS).where(ORDERS.c.id == oid).values(run_id=handle.run_id))
        # Not sent, and not visible to anyone else, before the commit.
        assert sent == []
        with threads.store.read() as tx:
            assert tx.get_run(handle.run_id) is None
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed" and run.output == "one step done"
    assert [r.run_id for r in orders(app_engine, oid)] == [handle.run_id]
    assert sent == [f"step:{handle.run_id}:0"]  # once


def test_a_run_started_in_a_transaction_that_rolls_back_leaves_nothing_and_sends_nothing(
    threads: Any, app_engine: sa.Engine, sent: list[str]
) -> None:
    oid = order_id()
    with Session(app_engine) as session:
        session.begin()
        session.execute(sa.insert(ORDERS).values(id=oid))
        handle = threads.start(agents.one_step, f"about {oid}", within=session)
        session.rollback()
    # A later commit on the same session sends nothing of the rolled-back start.
    with Session(app_engine) as session, session.begin():
        session.execute(sa.insert(ORDERS).values(id=order_id()))
    with app_engine.begin() as conn:
        rolled = threads.start(agents.one_step, "rolled back", within=conn)
        conn.rollback()
    assert orders(app_engine, oid) == []
    with threads.store.read() as tx:
        assert tx.get_run(handle.run_id) is None and tx.get_run(rolled.run_id) is None
        assert tx.outbox_of_runs([handle.run_id, rolled.run_id]) == []
    assert sent == []


def test_a_run_started_on_a_connection_runs_once_its_transaction_commits(
    threads: Any, app_engine: sa.Engine, sent: list[str]
) -> None:
    oid = order_id()
    with app_engine.begin() as conn:
        conn.execute(sa.insert(ORDERS).values(id=oid))
        handle = threads.start(agents.one_step, f"about {oid}", within=conn)
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert len(orders(app_engine, oid)) == 1
    eventually(lambda: sent == [f"step:{handle.run_id}:0"], timeout=WAIT_S, what="the one send")


def test_an_approval_in_the_callers_transaction_runs_the_call_only_after_the_commit(
    threads: Any, app_engine: sa.Engine
) -> None:
    handle = threads.start(agents.asks_first, "go")
    [call] = eventually(
        lambda: [c for c in threads.pending(handle.run_id) if c.status == "awaiting_approval"],
        timeout=WAIT_S,
        what="the call awaiting approval",
    )
    with Session(app_engine) as session:
        session.begin()
        threads.approve(call.effect_key, principal="ann", within=session)
        session.rollback()
    assert [c.status for c in threads.pending(handle.run_id)] == ["awaiting_approval"]
    with Session(app_engine) as session, session.begin():
        threads.approve(call.effect_key, principal="ann", within=session)
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"


def test_a_transaction_on_another_database_is_refused(threads: Any, pg_url_module: str) -> None:
    other = sa.create_engine(pg_url_module.rsplit("/", 1)[0] + "/postgres")
    try:
        with other.begin() as conn, pytest.raises(ConfigError, match="another database"):
            threads.start(agents.one_step, "x", within=conn)
    finally:
        other.dispose()
    with pytest.raises(TypeError, match="Session or Connection"):
        threads.start(agents.one_step, "x", within=object())


DIES_AFTER_COMMIT = """
import os, sys
import sqlalchemy as sa
from sqlalchemy.orm import Session
import threads_celery.client.caller_tx as caller_tx
from tests.integration import agents_for_tests as agents
from threads_celery import Threads

def die(*_args, **_kwargs):
    print(handle.run_id, flush=True)
    os._exit(137)  # committed, never sent: like a SIGKILL right after the commit

caller_tx._send_once_visible = die
threads = Threads(database_url=sys.argv[1], broker_url=sys.argv[2])
threads.register(agents.one_step)
engine = sa.create_engine(sys.argv[1])
with Session(engine) as session, session.begin():
    session.execute(sa.text("INSERT INTO app_orders (id) VALUES (:id)"), {"id": sys.argv[3]})
    handle = threads.start(agents.one_step, "about the order", within=session)
"""


def test_a_process_that_dies_between_the_commit_and_the_send_leaves_the_run_to_beat(
    migrated_pg_url: str, integration_redis_url: str, app_engine: sa.Engine, tmp_path: Path
) -> None:
    oid = order_id()
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent(DIES_AFTER_COMMIT))
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "tests.integration.agents_for_tests",
            "THREADS_OUTBOX_STALE_AFTER_S": "1",
            "THREADS_RECONCILE_INTERVAL_S": "0.5",
        }
    )
    died = subprocess.run(
        [sys.executable, str(script), migrated_pg_url, integration_redis_url, oid],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert died.returncode == 137, died.stderr
    run_id = died.stdout.strip()
    assert len(orders(app_engine, oid)) == 1
    from tests.support.clients import registered_client

    worker = WorkerProcess("within-w", env=env, log_path=tmp_path / "worker.log", pool="solo", concurrency=1)
    beat = BeatProcess("within-beat", env=env, log_path=tmp_path / "beat.log", schedule_path=tmp_path / "schedule")
    with registered_client(migrated_pg_url, integration_redis_url, [agents.one_step]) as threads:
        with threads.store.read() as tx:
            assert [e.key for e in tx.outbox_of_runs([run_id])] == [f"step:{run_id}:0"]  # committed, unsent
        with worker.running(), beat:
            beat.start()
            run = threads.wait(run_id, WAIT_S)
    assert run.status == "completed", (run.status, run.error, worker.log_tail())
