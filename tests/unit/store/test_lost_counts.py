"""The ledger's count of lost worker processes (``Tx.count_lost_step``, ``Tx.count_lost_call``).

Counted by a worker's main process when a pool process dies under a step or call (see
threads_celery.worker.lost_workers); read by the next delivery, which ends the run at the bound.
The dead process's leases end at once; a lease someone else holds is left alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, update

from threads_celery import Threads
from threads_celery.store.schema import runs, tool_calls

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)
DEAD, ALIVE = "host:101", "host:202"


def _run(threads: Threads, *, owner: str | None) -> None:
    with threads.store.transaction() as tx:
        tx.insert_thread("thread_1", "a", "h", T0)
        tx.insert_run("run_1", "thread_1", "a", "go", T0)
        tx.conn.execute(update(runs).values(status="running", lease_owner=owner, lease_expires_at=LATER))


def _call(threads: Threads, *, status: str, owner: str | None) -> None:
    with threads.store.transaction() as tx:
        tx.conn.execute(
            insert(tool_calls).values(
                effect_key="run_1:0:0", run_id="run_1", thread_id="thread_1", step=0, idx=0, calls_in_step=1,
                call_id="c0", tool="pay", args="{}", args_hash="h", effect="idempotent", status=status,
                attempt=1, is_error=False, created_at=T0, lease_owner=owner, lease_expires_at=LATER,
            )
        )  # fmt: skip


def _row(threads: Threads, table: Any, *columns: str) -> tuple[Any, ...]:
    with threads.store.read() as tx:
        row = tx.conn.execute(select(*(table.c[name] for name in columns))).one()
    return tuple(row)


def test_a_step_counts_in_a_row_and_starts_again_on_another_step(tmp_path: Path) -> None:
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        _run(threads, owner=ALIVE)
        with threads.store.transaction() as tx:
            tx.count_lost_step("run_1", 0, owner=DEAD, now=T0)
            tx.count_lost_step("run_1", 0, owner=DEAD, now=T0)
        # A lease the dead process did not hold is left alone.
        assert _row(threads, runs, "lost_step", "lost_times", "lease_expires_at") == (0, 2, LATER)
        with threads.store.transaction() as tx:
            tx.conn.execute(update(runs).values(step=1, lease_owner=DEAD))
            tx.count_lost_step("run_1", 1, owner=DEAD, now=T0)
        assert _row(threads, runs, "lost_step", "lost_times", "lease_expires_at") == (1, 1, T0)
        with threads.store.transaction() as tx:
            tx.count_lost_step("run_1", 0, owner=DEAD, now=T0)  # not the run's step: nothing
            tx.conn.execute(update(runs).values(status="completed"))
            tx.count_lost_step("run_1", 1, owner=DEAD, now=T0)  # an ended run: nothing
        assert _row(threads, runs, "lost_step", "lost_times") == (1, 1)
        assert threads.get_run("run_1").lost_times == 1


def test_a_call_counts_while_unsettled_and_its_dead_holders_leases_end(tmp_path: Path) -> None:
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        _run(threads, owner=DEAD)
        _call(threads, status="started", owner=DEAD)
        with threads.store.transaction() as tx:
            tx.count_lost_call("run_1:0:0", owner=DEAD, now=T0)
        assert _row(threads, tool_calls, "lost_times", "lease_expires_at") == (1, T0)
        assert _row(threads, runs, "lease_expires_at") == (T0,)
        with threads.store.transaction() as tx:
            tx.conn.execute(update(tool_calls).values(lease_owner=ALIVE, lease_expires_at=LATER))
            tx.conn.execute(update(runs).values(lease_owner=ALIVE, lease_expires_at=LATER))
            tx.count_lost_call("run_1:0:0", owner=DEAD, now=T0)
        assert _row(threads, tool_calls, "lost_times", "lease_expires_at") == (2, LATER)
        assert _row(threads, runs, "lease_expires_at") == (LATER,)
        with threads.store.transaction() as tx:
            tx.conn.execute(update(tool_calls).values(status="completed"))
            tx.count_lost_call("run_1:0:0", owner=DEAD, now=T0)
        assert _row(threads, tool_calls, "lost_times") == (2,)
        with threads.store.read() as tx:
            loaded = tx.get_call_and_run("run_1:0:0")
        assert loaded is not None and loaded[0].lost_times == 2
