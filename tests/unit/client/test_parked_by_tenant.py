"""``Threads.parked(tenant=...)``: a tenant's waiting calls, chosen in the query.

The HTTP API's ``GET /v1/parked`` lists the caller's own. It used to filter the first 200 calls
of each status across every tenant, so another tenant's older calls could crowd the caller's out
of its own list. Here 250 older calls of one tenant wait beside one of another's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert

from threads_celery import Threads
from threads_celery.store.schema import tool_calls

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _waiting(threads: Threads, thread_id: str, run_id: str, n: int, status: str, at: datetime) -> None:
    with threads.store.transaction() as tx:
        tx.conn.execute(
            insert(tool_calls).values(
                effect_key=f"{run_id}:0:{n}", run_id=run_id, thread_id=thread_id, step=0, idx=n, calls_in_step=1,
                call_id=f"c{n}", tool="pay", args="{}", args_hash="h", effect="unguarded", status=status,
                attempt=0, is_error=False, created_at=at,
            )
        )  # fmt: skip


def test_another_tenants_calls_never_crowd_a_tenants_own_out(tmp_path: Path) -> None:
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        with threads.store.transaction() as tx:
            tx.insert_thread("thread_b", "a", "h", T0, tenant="globex")
            tx.insert_thread("thread_a", "a", "h", T0, tenant="acme")
            tx.insert_run("run_b", "thread_b", "a", "go", T0)
            tx.insert_run("run_a", "thread_a", "a", "go", T0)
        for n in range(250):
            _waiting(threads, "thread_b", "run_b", n, "awaiting_approval", T0 + timedelta(seconds=n))
        _waiting(threads, "thread_a", "run_a", 0, "awaiting_approval", T0 + timedelta(hours=1))
        _waiting(threads, "thread_a", "run_a", 1, "parked", T0 + timedelta(hours=2))
        everyone = threads.parked()
        assert "run_a:0:0" not in {c.effect_key for c in everyone}  # the first 200 of each status
        assert [c.effect_key for c in threads.parked(tenant="acme")] == ["run_a:0:1", "run_a:0:0"]
        assert len(threads.parked(tenant="globex")) == 250
        assert threads.parked(tenant="initech") == []
