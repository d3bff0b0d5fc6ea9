"""Reconcile tick time against retained history: it must track what is due, not what is kept.

Fills a fresh PostgreSQL database with N retained (finished) runs, each with a finished tool
call, plus a fixed number of due runs (running, lease expired), then times
``Runtime.reconcile_tick()`` (publishing to a recording stub, so only the ledger work is timed).
Between repeats the due runs are made due again. Prints the median per N and the ratio between
the two largest sizes (target: at most 1.3x from 10k to 100k).

    .venv/bin/python bench/reconcile_tick.py --sizes 1000 10000 100000 --due 100 --repeat 7
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta

import psycopg
from sqlalchemy import delete, insert, update

from threads_celery.definitions.agents import AgentRegistry
from threads_celery.runtime.machine import Runtime
from threads_celery.settings import Settings
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import outbox, runs, threads, tool_calls
from threads_celery.transitions.runs import utcnow

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def fill(store: Store, retained: int, due: int) -> list[str]:
    now = utcnow()
    long_ago = now - timedelta(days=3)
    batch = 5000
    with store.transaction() as tx:
        tx.conn.execute(
            insert(threads),
            [{"id": "t-bench", "agent": "bench", "config_hash": "x", "created_at": long_ago}],
        )
    for start in range(0, retained, batch):
        count = min(batch, retained - start)
        ids = [f"r-{start + i}" for i in range(count)]
        with store.transaction() as tx:
            tx.conn.execute(
                insert(runs),
                [
                    {
                        "id": rid,
                        "thread_id": "t-bench",
                        "agent": "bench",
                        "status": "completed",
                        "input": "hi",
                        "step": 2,
                        "fence": 6,
                        "output": "ok",
                        "created_at": long_ago,
                        "finished_at": long_ago,
                        "updated_at": long_ago,
                    }
                    for rid in ids
                ],
            )
            tx.conn.execute(
                insert(tool_calls),
                [
                    {
                        "effect_key": f"{rid}:0:0",
                        "run_id": rid,
                        "thread_id": "t-bench",
                        "step": 0,
                        "idx": 0,
                        "calls_in_step": 1,
                        "call_id": "c",
                        "tool": "noop",
                        "args": "{}",
                        "args_hash": "h",
                        "effect": "unguarded",
                        "status": "completed",
                        "attempt": 1,
                        "is_error": False,
                        "created_at": long_ago,
                        "finished_at": long_ago,
                    }
                    for rid in ids
                ],
            )
    due_ids = [f"due-{i}" for i in range(due)]
    with store.transaction() as tx:
        tx.conn.execute(
            insert(runs),
            [
                {
                    "id": rid,
                    "thread_id": "t-bench",
                    "agent": "bench",
                    "status": "running",
                    "input": "hi",
                    "step": 0,
                    "fence": 1,
                    "lease_owner": "dead",
                    "created_at": now,
                    "updated_at": now,
                    "lease_expires_at": now - timedelta(seconds=30),
                }
                for rid in due_ids
            ],
        )
        tx.conn.exec_driver_sql("ANALYZE")
    return due_ids


def make_due_again(store: Store, due_ids: list[str]) -> None:
    past = utcnow() - timedelta(seconds=30)
    with store.transaction() as tx:
        tx.conn.execute(update(runs).where(runs.c.id.in_(due_ids)).values(lease_owner="dead", lease_expires_at=past))
        tx.conn.execute(delete(outbox))


def measure(size: int, due: int, repeat: int) -> tuple[float, int]:
    name = f"bench_tick_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    store = Store(create_store_engine(parse_database_url(f"postgresql://postgres@127.0.0.1:5432/{name}")))
    try:
        upgrade(store.engine)
        due_ids = fill(store, size, due)
        published: list[object] = []
        runtime = Runtime(store, AgentRegistry(), publish=published.extend, settings=Settings())
        times = []
        for _ in range(repeat):
            make_due_again(store, due_ids)
            published.clear()
            started = time.perf_counter()
            result = runtime.reconcile_tick()
            times.append(time.perf_counter() - started)
            assert result["expired_runs"] == due, result
        return statistics.median(times), len(published)
    finally:
        store.dispose()
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    import logging

    logging.getLogger("threads_celery").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    results = {}
    print(f"{'retained runs':>14} {'due':>5} {'median tick':>12} {'published':>10}")
    for size in args.sizes:
        median, published = measure(size, args.due, args.repeat)
        results[size] = median
        print(f"{size:>14} {args.due:>5} {median * 1000:>9.1f} ms {published:>10}")
    if len(args.sizes) >= 2:
        small, large = sorted(args.sizes)[-2:]
        print(f"ratio {large} / {small}: {results[large] / results[small]:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
