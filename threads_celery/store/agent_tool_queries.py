"""The named queries of agent-tool runs and milestones (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from threads_celery.records import AgentToolRun, Milestone
from threads_celery.store.rows import agent_tool_run_from_row
from threads_celery.store.schema import agent_tool_runs, milestones, threads


class AgentToolQueries:
    """Queries over ``agent_tool_runs`` and ``milestones``; mixed into the transaction."""

    conn: Connection

    def insert_agent_tool_run(self, values: dict[str, Any]) -> None:
        self.conn.execute(insert(agent_tool_runs).values(**values))

    def get_agent_tool_run(
        self, run_id: str, *, lock: bool = False, with_milestones: bool = False
    ) -> AgentToolRun | None:
        query = select(agent_tool_runs).where(agent_tool_runs.c.run_id == run_id)
        if lock:
            query = query.with_for_update()
        row = self.conn.execute(query).first()
        if row is None:
            return None
        found = self.list_milestones(run_id) if with_milestones else ()
        return agent_tool_run_from_row(row, found)

    def update_agent_tool_run(self, run_id: str, **values: Any) -> None:
        self.conn.execute(update(agent_tool_runs).where(agent_tool_runs.c.run_id == run_id).values(**values))

    def list_agent_tool_runs(
        self,
        parent_thread_id: str,
        *,
        statuses: Sequence[str] | None = None,
        older_than: datetime | None = None,
    ) -> list[AgentToolRun]:
        query = (
            select(agent_tool_runs)
            .where(agent_tool_runs.c.parent_thread_id == parent_thread_id)
            .order_by(agent_tool_runs.c.created_at, agent_tool_runs.c.display_order)
        )
        if statuses:
            query = query.where(agent_tool_runs.c.status.in_(list(statuses)))
        if older_than is not None:
            query = query.where(agent_tool_runs.c.started_at < older_than)
        return [agent_tool_run_from_row(row, ()) for row in self.conn.execute(query)]

    def count_active_agent_tool_runs(self, parent_thread_id: str, agent_type: str | None = None) -> int:
        """Starting or running agent-tool runs of a parent thread (of one agent type, if given)."""
        query = (
            select(func.count())
            .select_from(agent_tool_runs)
            .where(
                agent_tool_runs.c.parent_thread_id == parent_thread_id,
                agent_tool_runs.c.status.in_(["starting", "running"]),
            )
        )
        if agent_type is not None:
            query = query.where(agent_tool_runs.c.agent_type == agent_type)
        return int(self.conn.execute(query).scalar_one())

    def delete_agent_tool_run(self, run_id: str, child_thread_id: str | None) -> None:
        self.conn.execute(delete(milestones).where(milestones.c.agent_tool_run_id == run_id))
        self.conn.execute(delete(agent_tool_runs).where(agent_tool_runs.c.run_id == run_id))
        if child_thread_id is not None:
            self.conn.execute(delete(threads).where(threads.c.id == child_thread_id))

    def due_agent_tool_runs(self, *, now: datetime, limit: int, lock: bool = True) -> list[AgentToolRun]:
        """Runs whose budget or silence window may have run out (with ``lock``: locked, SKIP LOCKED)."""
        query = (
            select(agent_tool_runs)
            .where(agent_tool_runs.c.check_at <= now)
            .order_by(agent_tool_runs.c.check_at)
            .limit(limit)
        )
        if lock:
            query = query.with_for_update(skip_locked=True)
        return [agent_tool_run_from_row(row, ()) for row in self.conn.execute(query)]

    def undelivered_agent_tool_runs(self, *, now: datetime, limit: int) -> list[AgentToolRun]:
        """Finished runs whose delivery was claimed and the claim lapsed (the deliverer died)."""
        query = (
            select(agent_tool_runs)
            .where(agent_tool_runs.c.delivery_lease_until < now)
            .order_by(agent_tool_runs.c.delivery_lease_until)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [agent_tool_run_from_row(row, ()) for row in self.conn.execute(query)]

    def claim_delivery(self, run_id: str, *, owner: str, until: datetime, now: datetime) -> bool:
        """Take the delivery claim unless another deliverer holds a live one."""
        result = self.conn.execute(
            update(agent_tool_runs)
            .where(
                agent_tool_runs.c.run_id == run_id,
                (agent_tool_runs.c.delivery_lease_until.is_(None)) | (agent_tool_runs.c.delivery_lease_until < now),
            )
            .values(
                delivery_owner=owner,
                delivery_lease_until=until,
                delivery_attempts=agent_tool_runs.c.delivery_attempts + 1,
            )
        )
        return result.rowcount == 1

    def insert_milestone(self, run_id: str, name: str, data: Any, now: datetime) -> int:
        last = self.conn.execute(
            select(func.max(milestones.c.sequence)).where(milestones.c.agent_tool_run_id == run_id)
        ).scalar()
        sequence = 0 if last is None else int(last) + 1
        self.conn.execute(
            insert(milestones).values(agent_tool_run_id=run_id, sequence=sequence, name=name, data=data, at=now)
        )
        return sequence

    def list_milestones(self, run_id: str) -> tuple[Milestone, ...]:
        rows = self.conn.execute(
            select(milestones).where(milestones.c.agent_tool_run_id == run_id).order_by(milestones.c.sequence)
        )
        return tuple(Milestone(sequence=r.sequence, name=r.name, data=r.data, at=r.at) for r in rows)

    def thread_agent(self, thread_id: str) -> str | None:
        return self.conn.execute(select(threads.c.agent).where(threads.c.id == thread_id)).scalar()
