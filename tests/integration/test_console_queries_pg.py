"""The console's run list on PostgreSQL with 11,000 runs: right pages, and plans that use an index.

10,000 runs of one tenant and 1,000 of another (over 200 threads, five agents, every status) are
inserted at once, the tables analyzed, and each shape of the list's statement (no filter, by
agent, by status, by thread, the next page) is explained: none may read the whole runs table
(a sequential scan of ``runs``), which is what kept a page of 50 from staying fast as runs pile up.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, text
from sqlalchemy.dialects import postgresql

from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.console_queries import console_runs_query
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import messages, runs, threads, tool_calls

pytestmark = pytest.mark.integration

STATUSES = ("completed", "error", "running", "parked", "awaiting_approval")
AGENTS = ("triage", "billing", "research", "support", "digest")
T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def store(pg_url_module: str) -> Iterator[Store]:
    engine = create_store_engine(parse_database_url(pg_url_module))
    upgrade(engine)
    ledger = Store(engine)
    thread_rows = [
        {
            "id": f"thread_{n:04d}",
            "agent": AGENTS[n % 5],
            "config_hash": "x",
            "event_seq": 0,
            "created_at": T0,
            "tenant": "acme" if n < 180 else "globex",
        }
        for n in range(200)
    ]
    run_rows = []
    for n in range(11_000):
        thread = n % 180 if n < 10_000 else 180 + n % 20
        at = T0 + timedelta(seconds=n)
        run_rows.append(
            {
                "id": f"run_{n:05d}",
                "thread_id": f"thread_{thread:04d}",
                "agent": AGENTS[n % 5],
                "status": STATUSES[n % 5],
                "input": "hi",
                "step": 0,
                "fence": 0,
                "created_at": at,
                "updated_at": at,
            }
        )
    with ledger.transaction() as tx:
        tx.conn.execute(insert(threads), thread_rows)
        tx.conn.execute(insert(runs), run_rows)
    with engine.begin() as conn:  # committed: statistics gathered in a rolled-back transaction are lost
        conn.execute(text("ANALYZE threads"))
        conn.execute(text("ANALYZE runs"))
    try:
        yield ledger
    finally:
        engine.dispose()


def plan(store: Store, **filters: Any) -> str:
    statement = console_runs_query(limit=51, **filters)
    compiled = statement.compile(dialect=postgresql.dialect(), compile_kwargs={"render_postcompile": True})
    with store.read() as tx:
        rows = tx.conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    return "\n".join(row[0] for row in rows)


SHAPES: dict[str, dict[str, Any]] = {
    "newest": {},
    "by agent": {"agent": "billing"},
    "by status": {"statuses": ["parked"]},
    "by thread": {"thread_id": "thread_0007"},
    "next page": {"before": (T0 + timedelta(seconds=5_000), "run_05000")},
    "a time window": {"since": T0 + timedelta(seconds=100), "until": T0 + timedelta(seconds=900)},
}


@pytest.mark.parametrize("shape", SHAPES)
def test_no_shape_of_the_list_reads_the_whole_runs_table(store: Store, shape: str) -> None:
    found = plan(store, tenant="acme", **SHAPES[shape])
    assert "Seq Scan on runs" not in found and "Index" in found, found


def test_pages_are_the_tenants_newest_runs_each_once(store: Store) -> None:
    seen: list[str] = []
    before = None
    with store.read() as tx:
        while True:
            page = tx.console_runs(tenant="globex", before=before, limit=300)
            if not page:
                break
            seen.extend(r.id for r in page)
            before = (page[-1].created_at, page[-1].id)  # type: ignore[assignment]
        billing = tx.console_runs(tenant="acme", agent="billing", statuses=["error"], limit=50)
        counts = tx.run_status_counts("acme")
    assert seen == [f"run_{n:05d}" for n in range(10_999, 9_999, -1)]
    assert len(billing) == 50 and all(r.agent == "billing" and r.status == "error" for r in billing)
    assert counts == dict.fromkeys(STATUSES, 2_000)


def test_a_runs_calls_results_replies_and_grants_read_on_postgresql(store: Store) -> None:
    whole = "0123456789" * 100_000  # a million characters, kept whole beside a shortened one
    common = {"run_id": "run_00003", "thread_id": "thread_0003", "step": 0, "calls_in_step": 2, "args_hash": "h"}
    calls = [
        {**common, "effect_key": "run_00003:0:0", "idx": 0, "call_id": "c0", "tool": "fetch", "args": "{}",
         "effect": "read_only", "status": "completed", "attempt": 0, "is_error": False, "created_at": T0,
         "result": whole[:100], "full_result": whole},
        {**common, "effect_key": "run_00003:0:1", "idx": 1, "call_id": "c1", "tool": "pay", "args": '{"n": 1}',
         "effect": "unguarded", "status": "awaiting_approval", "attempt": 0, "is_error": False, "created_at": T0,
         "park_reason": "asks first"},
    ]  # fmt: skip
    with store.transaction() as tx:
        for call in calls:  # one by one: the two rows set different columns
            tx.conn.execute(insert(tool_calls).values(**call))
        tx.conn.execute(
            insert(messages),
            [{"thread_id": "thread_0003", "seq": 1, "run_id": "run_00003", "role": "assistant", "text": "thinking",
              "created_at": T0}],
        )  # fmt: skip
        tx.grant_tool("thread_0003", "pay", granted_by="alice", now=T0)
    with store.read() as tx:
        timeline = tx.call_timeline("run_00003", preview_chars=2000)
        page = tx.result_page("run_00003:0:0", offset=999_990, size=100)
        waiting = tx.tenant_waiting_calls("acme", ["awaiting_approval", "parked"])
        elsewhere = tx.tenant_waiting_calls("globex", ["awaiting_approval", "parked"])
        replies = tx.run_replies("thread_0003", "run_00003")
        grants = tx.tenant_grants("acme"), tx.tenant_grants("globex")
    assert [(c.tool, c.result_chars, len(c.result_preview or "")) for c in timeline] == [
        ("fetch", 1_000_000, 2000),
        ("pay", 0, 0),
    ]
    assert page == ("0123456789", 1_000_000)
    assert [c.effect_key for c in waiting] == ["run_00003:0:1"] and elsewhere == []
    assert [m.text for m in replies] == ["thinking"]
    assert [(g.thread_id, g.tool) for g in grants[0]] == [("thread_0003", "pay")] and grants[1] == []
