"""A run started in the caller's own transaction on a psycopg 3 connection, and on Django's
connection inside ``transaction.atomic()`` (the shop project of ``django_project/``), on
PostgreSQL with a real worker on Redis: it commits with the app's row or vanishes with it, is
sent once, after the commit, and a view's process SIGKILLed between the commit and the send
leaves it to a real Beat (``manage.py threads beat``), which gets it run once.

The ledger lives in the module's database beside the app's table (psycopg) and the shop's
(Django, migrated by ``manage.py migrate``), as a web app's would.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.integration import agents_for_tests as agents
from tests.integration.django_project.harness import PROJECT, manage, project_env, require_django, shop_script
from tests.support.clients import registered_client
from tests.support.processes import REPO_ROOT, ManagedProcess, WorkerProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery.exceptions import ConfigError

require_django()
pytestmark = pytest.mark.integration

WAIT_S = 60.0


# -- the services ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shop_db(pg_url_module: str, integration_redis_url: str) -> str:
    """The module's database with the shop's tables and the ledger's (``manage.py migrate``)."""
    done = manage(project_env(pg_url_module, integration_redis_url), "migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    assert "threads-celery ledger: migrated" in done.stdout, done.stdout
    return pg_url_module


@pytest.fixture(scope="module")
def worker(
    shop_db: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A real worker running the test agents and the shop's (``shop.agents``)."""
    env = subprocess_env(
        {
            "PYTHONPATH": f"{REPO_ROOT}:{PROJECT}",
            "THREADS_DATABASE_URL": shop_db,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "tests.integration.agents_for_tests,shop.agents",
        }
    )
    process = WorkerProcess("dj-w", env=env, log_path=tmp_path_factory.mktemp("worker") / "w.log", concurrency=2)
    with process.running(60.0):
        yield process


@pytest.fixture(scope="module")
def threads(worker: WorkerProcess, shop_db: str, integration_redis_url: str) -> Iterator[Any]:
    with registered_client(shop_db, integration_redis_url, agents.ALL_AGENTS) as client:
        yield client


def pg_connect(url: str, **options: Any) -> psycopg.Connection[Any]:
    parts = make_url(url)
    return psycopg.connect(host=parts.host, port=parts.port, user=parts.username, dbname=parts.database, **options)


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


# -- a psycopg connection ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def app_table(shop_db: str) -> str:
    with pg_connect(shop_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pg_orders (id text PRIMARY KEY, run_id text)")
    return "pg_orders"


def pg_orders(url: str, oid: str) -> list[tuple[Any, ...]]:
    with pg_connect(url, autocommit=True) as conn:
        return conn.execute("SELECT id, run_id FROM pg_orders WHERE id = %s", (oid,)).fetchall()


def test_a_run_started_on_a_psycopg_connection_runs_once_after_its_commit(
    threads: Any, shop_db: str, app_table: str, sent: list[str]
) -> None:
    oid = f"order-{uuid.uuid4().hex[:12]}"
    with pg_connect(shop_db, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO pg_orders (id) VALUES (%s)", (oid,))
            handle = threads.start(agents.one_step, f"about {oid}", within=conn)
            conn.execute("UPDATE pg_orders SET run_id = %s WHERE id = %s", (handle.run_id, oid))
            assert sent == []
            with threads.store.read() as tx:
                assert tx.get_run(handle.run_id) is None  # not visible to anyone else yet
        # The caller's connection is still its own: open, usable, and out of any transaction.
        assert conn.execute("SELECT 1").fetchone() == (1,)
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed" and run.output == "one step done"
    assert pg_orders(shop_db, oid) == [(oid, handle.run_id)]
    eventually(lambda: sent == [f"step:{handle.run_id}:0"], timeout=WAIT_S, what="the one send")


def test_a_run_started_on_a_psycopg_connection_that_rolls_back_leaves_nothing(
    threads: Any, shop_db: str, app_table: str, sent: list[str]
) -> None:
    oid = f"order-{uuid.uuid4().hex[:12]}"
    with pg_connect(shop_db) as conn:  # out of autocommit: the first statement begins the transaction
        conn.execute("INSERT INTO pg_orders (id) VALUES (%s)", (oid,))
        handle = threads.start(agents.one_step, f"about {oid}", within=conn)
        conn.rollback()
    assert pg_orders(shop_db, oid) == []
    with threads.store.read() as tx:
        assert tx.get_run(handle.run_id) is None
        assert tx.outbox_of_runs([handle.run_id]) == []
    assert sent == []


def test_a_psycopg_connection_without_a_transaction_or_on_another_database_is_refused(
    threads: Any, shop_db: str, pg_admin_url: str
) -> None:
    with pg_connect(shop_db, autocommit=True) as conn, pytest.raises(ConfigError, match="no transaction open"):
        threads.start(agents.one_step, "x", within=conn)
    with (
        pg_connect(pg_admin_url, autocommit=True) as other,
        other.transaction(),
        pytest.raises(ConfigError, match="another database"),
    ):
        threads.start(agents.one_step, "x", within=other)


# -- Django's connection in transaction.atomic() -----------------------------------------------

#: Posts orders through the shop's view with Django's test client, and prints what happened:
#: each response, and the keys the process handed to the broker.
POST_ORDERS = """
import json, sys
from threads_celery.transitions.publishing import Publisher
keys = []
publish = Publisher.__call__
def recording(self, entries):
    keys.extend(e.key for e in entries)
    return publish(self, entries)
Publisher.__call__ = recording
from django.test import Client
client = Client()
responses = [client.post("/orders", {"item": item}) for item in sys.argv[1:]]
print(json.dumps({"responses": [[r.status_code, r.json()] for r in responses], "sent": keys}))
"""

#: Posts one order, SIGKILLing the process in Django's on_commit callback: committed, never sent.
DIES_AFTER_COMMIT = """
import os, signal
import threads_celery.client.caller_tx as caller_tx
def die(send):
    os.kill(os.getpid(), signal.SIGKILL)
caller_tx._send_now = die
from django.test import Client
Client().post("/orders", {"item": "a kite"})
"""


def shop_orders(url: str) -> dict[str, str]:
    with pg_connect(url, autocommit=True) as conn:
        return dict(conn.execute("SELECT item, run_id FROM shop_order").fetchall())


def test_a_view_saves_its_order_and_starts_its_run_in_one_atomic_block(
    threads: Any, shop_db: str, integration_redis_url: str
) -> None:
    done = shop_script(project_env(shop_db, integration_redis_url), POST_ORDERS, "a book", "unicorn")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    (created, placed), (refused, rolled_back) = out["responses"]
    assert created == 201 and refused == 409, out
    # The committed order has its run, which the worker ran; it was sent once, after the commit.
    run = threads.wait(placed["run_id"], WAIT_S)
    assert run.status == "completed" and run.output == "Your order is confirmed."
    assert shop_orders(shop_db).get("a book") == placed["run_id"]
    assert out["sent"] == [f"step:{placed['run_id']}:0"]
    # The order found out of stock after the start rolled back: no order, no run, nothing sent.
    assert "unicorn" not in shop_orders(shop_db)
    with threads.store.read() as tx:
        assert tx.get_run(rolled_back["run_id"]) is None
        assert tx.outbox_of_runs([rolled_back["run_id"]]) == []


def test_starting_outside_an_atomic_block_is_refused_naming_it(shop_db: str, integration_redis_url: str) -> None:
    script = """
from django.db import connection
from shop.agents import order_helper
from threads_celery.contrib.django import get_threads
from threads_celery.exceptions import ConfigError
try:
    get_threads().start(order_helper, "x", within=connection)
except ConfigError as exc:
    print("refused:", exc)
"""
    done = shop_script(project_env(shop_db, integration_redis_url), script)
    assert done.returncode == 0, done.stderr
    assert "refused: within=connection: Django's connection is in autocommit here" in done.stdout
    assert "transaction.atomic()" in done.stdout


def test_a_view_killed_between_its_commit_and_the_send_has_its_run_started_once_by_beat(
    threads: Any, shop_db: str, integration_redis_url: str, tmp_path: Path
) -> None:
    before = shop_orders(shop_db)
    env = project_env(
        shop_db, integration_redis_url, THREADS_OUTBOX_STALE_AFTER_S="1", THREADS_RECONCILE_INTERVAL_S="0.5"
    )
    died = shop_script(env, DIES_AFTER_COMMIT)
    assert died.returncode == -9, died.stderr
    run_id = shop_orders(shop_db)["a kite"]
    assert "a kite" not in before and run_id
    with threads.store.read() as tx:
        assert [e.key for e in tx.outbox_of_runs([run_id])] == [f"step:{run_id}:0"]  # committed, unsent
    beat = ManagedProcess(
        "dj-beat",
        [sys.executable, "manage.py", "threads", "beat", "--schedule", str(tmp_path / "schedule"), "-l", "INFO"],
        env=env,
        log_path=tmp_path / "beat.log",
        cwd=PROJECT,
    )
    with beat:
        beat.start()
        run = threads.wait(run_id, WAIT_S)
    assert run.status == "completed", (run.status, run.error, beat.log_tail())
    replies = [m for m in threads.messages(run.thread_id) if m.role == "assistant"]
    assert [m.text for m in replies] == ["Your order is confirmed."]  # started and run once


#: Approves a call inside an atomic block, which rolls back when argv[2] says so.
APPROVES = """
import sys
from django.db import connection, transaction
from threads_celery.contrib.django import get_threads
with transaction.atomic():
    get_threads().approve(sys.argv[1], principal="ann", within=connection)
    transaction.set_rollback(sys.argv[2] == "rollback")
"""


def test_an_approval_in_an_atomic_block_runs_the_call_only_once_it_commits(
    threads: Any, shop_db: str, integration_redis_url: str
) -> None:
    handle = threads.start(agents.asks_first, "go")
    [call] = eventually(
        lambda: [c for c in threads.pending(handle.run_id) if c.status == "awaiting_approval"],
        timeout=WAIT_S,
        what="the call awaiting approval",
    )
    env = project_env(shop_db, integration_redis_url)
    rolled_back = shop_script(env, APPROVES, call.effect_key, "rollback")
    assert rolled_back.returncode == 0, rolled_back.stderr
    assert [c.status for c in threads.pending(handle.run_id)] == ["awaiting_approval"]
    committed = shop_script(env, APPROVES, call.effect_key, "commit")
    assert committed.returncode == 0, committed.stderr
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
