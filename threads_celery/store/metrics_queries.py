"""The named queries behind the Prometheus gauges (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from threads_celery.records import MetricsSnapshot
from threads_celery.store.schema import outbox, runs, tool_calls


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
