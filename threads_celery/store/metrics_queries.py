"""The named queries behind the Prometheus gauges (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from threads_celery.store.schema import outbox, runs, tool_calls


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What the ledger holds, counted at one moment."""

    runs_by_status: dict[str, int]
    parked_calls: int
    outbox_depth: int
    reconcile_lag_s: float


class MetricsQueries:
    """Counting queries for metrics; mixed into the transaction."""

    conn: Connection

    def metrics_snapshot(self, now: datetime) -> MetricsSnapshot:
        """Runs by status, parked calls, outbox depth and the most overdue outbox row's lag."""
        by_status = {
            str(status): int(count)
            for status, count in self.conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status))
        }
        parked = int(
            self.conn.execute(
                select(func.count()).select_from(tool_calls).where(tool_calls.c.status == "parked")
            ).scalar_one()
        )
        depth, oldest_due = self.conn.execute(select(func.count(), func.min(outbox.c.due_at))).one()
        lag = 0.0
        if oldest_due is not None:
            due = oldest_due if oldest_due.tzinfo is not None else oldest_due.replace(tzinfo=UTC)
            lag = max(0.0, (now - due).total_seconds())
        return MetricsSnapshot(by_status, parked, int(depth), lag)
