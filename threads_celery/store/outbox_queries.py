"""The named queries of the outbox (a part of :class:`~.repository.Tx`).

A row is an intent to publish one task, written in the transaction of the transition that
caused it and deleted by the task that consumes it; the reconcile backbone republishes a row
nobody consumed in time. A tool task's row waits a whole tool grace before it is due (a running
read_only call keeps it alive), any other task's a step grace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.engine import Connection

from threads_celery.records import OutboxEntry
from threads_celery.store import statements
from threads_celery.store.schema import outbox

TOOL_TASK_NAME = "threads.tool"


class OutboxQueries:
    """Queries over ``outbox``; mixed into the transaction."""

    conn: Connection
    dialect: str
    step_grace: timedelta
    tool_grace: timedelta

    def _outbox_grace(self, task: str) -> timedelta:
        return self.tool_grace if task == TOOL_TASK_NAME else self.step_grace

    def insert_outbox(self, entry: OutboxEntry, now: datetime) -> None:
        """Record the intent to publish ``entry`` (a no-op if that key is already pending)."""
        values = {
            "b_key": entry.key,
            "b_task": entry.task,
            "b_args": list(entry.args),
            "b_queue": entry.queue,
            "b_argsrepr": entry.argsrepr,
            "b_created_at": now,
            "b_due_at": now + self._outbox_grace(entry.task),
            "b_publish_count": 0,
        }
        self.conn.execute(statements.insert_outbox(self.dialect), values)

    def delete_outbox(self, key: str) -> None:
        self.conn.execute(statements.DELETE_OUTBOX, {"b_key": key})

    def due_outbox(
        self, *, now: datetime, limit: int, republish_delay: Callable[[timedelta, int], timedelta]
    ) -> list[OutboxEntry]:
        """Rows nobody consumed in time (a publish was lost, or its worker died), moved forward.

        Locked with SKIP LOCKED, so two reconcilers never take the same row. A read_only tool's
        row lives until its result commits (it records no claim), so tool rows are due only
        after a whole tool lease, or after the call's last heartbeat. Each row is next due
        ``republish_delay(grace, times republished)`` from now: the backbone's pacing policy
        (:func:`threads_celery.decisions.backbone.republish_delay`), passed in because the
        ledger stores the schedule but does not decide it.
        """
        rows = list(
            self.conn.execute(
                select(outbox)
                .where(outbox.c.due_at <= now)
                .order_by(outbox.c.due_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        entries = [
            OutboxEntry(key=r.key, task=r.task, args=tuple(r.args), queue=r.queue, argsrepr=r.argsrepr) for r in rows
        ]
        # Backing off keeps a message that only waits behind a backlog from being copied into
        # the queue on every tick (see republish_delay).
        for task, republished in {(r.task, r.publish_count) for r in rows}:
            keys = [r.key for r in rows if r.task == task and r.publish_count == republished]
            self.conn.execute(
                update(outbox)
                .where(outbox.c.key.in_(keys))
                .values(
                    due_at=now + republish_delay(self._outbox_grace(task), republished),
                    publish_count=outbox.c.publish_count + 1,
                )
            )
        return entries

    def outbox_of_runs(self, run_ids: Sequence[str], agent_tool_run_ids: Sequence[str] = ()) -> list[OutboxEntry]:
        """The rows waiting for these runs: their steps' (``step:<run>:<n>``) and calls'
        (``<run>:<step>:<index>``), and the finish deliveries of these agent-tool runs
        (``deliver:<id>:<status>``), oldest first."""
        prefixes = [p for r in run_ids for p in (f"step:{r}:", f"{r}:")]
        prefixes += [f"deliver:{a}:" for a in agent_tool_run_ids]
        if not prefixes:
            return []
        rows = self.conn.execute(
            select(outbox)
            .where(or_(*(outbox.c.key.startswith(p, autoescape=True) for p in prefixes)))
            .order_by(outbox.c.created_at, outbox.c.key)
        )
        return [
            OutboxEntry(key=r.key, task=r.task, args=tuple(r.args), queue=r.queue, argsrepr=r.argsrepr) for r in rows
        ]

    def touch_outbox(self, key: str, now: datetime) -> None:
        """A running read_only call is alive: push its row's due time forward."""
        self.conn.execute(update(outbox).where(outbox.c.key == key).values(due_at=now + self.tool_grace))

    def outbox_keys(self) -> list[str]:
        return list(self.conn.execute(select(outbox.c.key).order_by(outbox.c.key)).scalars())
