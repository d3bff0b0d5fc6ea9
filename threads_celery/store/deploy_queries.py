"""The named queries of deployment versions (a part of :class:`~.repository.Tx`).

The versions workers registered and which one new runs start on (``deploy_versions``), the
workers alive of each (``deploy_workers``), where each run is (``runs.deploy_version``) and which
version took each of its steps and calls (``deploy_marks``). What they mean is decided in
:mod:`threads_celery.decisions.deploys`; these only read and write.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from threads_celery.records import ACTIVE_STATUSES, DeployVersion, Run
from threads_celery.store.rows import run_from_row
from threads_celery.store.schema import (
    agent_tool_runs,
    deploy_marks,
    deploy_versions,
    deploy_workers,
    outbox,
    runs,
    tool_calls,
)

_UNFINISHED = sorted(ACTIVE_STATUSES)


def _version(row: Any) -> DeployVersion:
    return DeployVersion(
        version=row.version,
        role=row.role,
        ramp_percent=int(row.ramp_percent or 0),
        agents=dict(row.agents or {}),
        created_at=row.created_at,
        promoted_at=row.promoted_at,
        retired_at=row.retired_at,
    )


class DeployQueries:
    """Queries over the deployment tables and the runs' versions; mixed into the transaction."""

    conn: Connection
    dialect: str

    # -- versions ----------------------------------------------------------------------------

    def register_version(self, version: str, agents: dict[str, str], now: datetime) -> None:
        """Record ``version`` (a no-op when it is recorded); the first version of a ledger with no
        current one becomes current, so that a fleet turning versions on needs no command."""
        exists = self.conn.execute(
            select(deploy_versions.c.version).where(deploy_versions.c.version == version)
        ).first()
        if exists is None:
            try:
                with self.conn.begin_nested():
                    self.conn.execute(
                        insert(deploy_versions).values(version=version, agents=agents, created_at=now, ramp_percent=0)
                    )
            except IntegrityError:  # another worker of the version registered it meanwhile
                pass
        current = self.conn.execute(
            select(deploy_versions.c.version).where(deploy_versions.c.role == "current").with_for_update()
        ).first()
        if current is None:
            self.conn.execute(
                update(deploy_versions)
                .where(deploy_versions.c.version == version, deploy_versions.c.retired_at.is_(None))
                .values(role="current", ramp_percent=0, promoted_at=now)
            )

    def deploy_versions(self) -> list[DeployVersion]:
        rows = self.conn.execute(
            select(deploy_versions).order_by(deploy_versions.c.created_at, deploy_versions.c.version)
        )
        return [_version(row) for row in rows]

    def deploy_version(self, version: str) -> DeployVersion | None:
        row = self.conn.execute(select(deploy_versions).where(deploy_versions.c.version == version)).first()
        return None if row is None else _version(row)

    def placement(self) -> tuple[str | None, str | None, int]:
        """(current, ramping, ramp percent): where new runs start. (None, None, 0) when no
        version was ever registered."""
        rows = self.conn.execute(
            select(deploy_versions.c.version, deploy_versions.c.role, deploy_versions.c.ramp_percent).where(
                deploy_versions.c.role.in_(["current", "ramping"]), deploy_versions.c.retired_at.is_(None)
            )
        ).all()
        current = next((r.version for r in rows if r.role == "current"), None)
        ramping = next(((r.version, int(r.ramp_percent or 0)) for r in rows if r.role == "ramping"), (None, 0))
        return current, ramping[0], ramping[1]

    def set_current_version(self, version: str, now: datetime) -> None:
        """Make ``version`` current (the one before it keeps its ``promoted_at``, for a rollback);
        a ramp of it ends, being whole now."""
        self.conn.execute(update(deploy_versions).where(deploy_versions.c.role == "current").values(role=None))
        self.conn.execute(
            update(deploy_versions)
            .where(deploy_versions.c.version == version)
            .values(role="current", ramp_percent=0, promoted_at=now)
        )

    def set_ramping_version(self, version: str | None, percent: int) -> None:
        """Send ``percent`` of new runs to ``version`` (None: end any ramp)."""
        self.conn.execute(
            update(deploy_versions).where(deploy_versions.c.role == "ramping").values(role=None, ramp_percent=0)
        )
        if version is not None:
            self.conn.execute(
                update(deploy_versions)
                .where(deploy_versions.c.version == version)
                .values(role="ramping", ramp_percent=percent)
            )

    def retire_version(self, version: str, now: datetime) -> None:
        self.conn.execute(
            update(deploy_versions)
            .where(deploy_versions.c.version == version)
            .values(role=None, ramp_percent=0, retired_at=now)
        )

    # -- workers -----------------------------------------------------------------------------

    def worker_seen(self, worker: str, version: str, now: datetime) -> None:
        """Record that ``worker`` (of ``version``) is alive now."""
        seen = self.conn.execute(
            update(deploy_workers).where(deploy_workers.c.worker == worker).values(version=version, seen_at=now)
        )
        if seen.rowcount == 0:
            try:
                with self.conn.begin_nested():
                    self.conn.execute(
                        insert(deploy_workers).values(worker=worker, version=version, started_at=now, seen_at=now)
                    )
            except IntegrityError:
                pass

    def forget_worker(self, worker: str) -> None:
        """A worker that stops says so: its version loses it at once, not after the liveness window."""
        self.conn.execute(delete(deploy_workers).where(deploy_workers.c.worker == worker))

    def forget_workers_before(self, before: datetime) -> int:
        """Drop workers not seen since ``before`` (long gone); how many."""
        return int(self.conn.execute(delete(deploy_workers).where(deploy_workers.c.seen_at < before)).rowcount or 0)

    def deploy_workers_seen(self) -> list[tuple[str, str, datetime]]:
        rows = self.conn.execute(
            select(deploy_workers.c.worker, deploy_workers.c.version, deploy_workers.c.seen_at).order_by(
                deploy_workers.c.worker
            )
        )
        return [(r.worker, r.version, r.seen_at) for r in rows]

    # -- runs --------------------------------------------------------------------------------

    def unfinished_by_version(self) -> list[tuple[str, str, int]]:
        """(version, status, count) of the unfinished runs placed on a version."""
        rows = self.conn.execute(
            select(runs.c.deploy_version, runs.c.status, func.count())
            .where(runs.c.deploy_version.is_not(None), runs.c.status.in_(_UNFINISHED))
            .group_by(runs.c.deploy_version, runs.c.status)
        )
        return [(r[0], r[1], int(r[2])) for r in rows]

    def pinned_reasons_by_version(self) -> list[tuple[str, str, int]]:
        """(version, reason, count) of unfinished runs an upgrade check left pinned."""
        rows = self.conn.execute(
            select(runs.c.deploy_version, runs.c.deploy_pin_reason, func.count())
            .where(
                runs.c.deploy_version.is_not(None),
                runs.c.deploy_pin_reason.is_not(None),
                runs.c.status.in_(_UNFINISHED),
            )
            .group_by(runs.c.deploy_version, runs.c.deploy_pin_reason)
        )
        return [(r[0], r[1], int(r[2])) for r in rows]

    def place_run(self, run_id: str, version: str, policy: str) -> bool:
        """Put a run that is on no version yet on ``version``; False if it is on one already."""
        result = self.conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.deploy_version.is_(None))
            .values(deploy_version=version, deploy_policy=policy)
        )
        return result.rowcount == 1

    def mark_version(self, key: str, run_id: str, version: str, now: datetime) -> None:
        """Record that ``version`` took the step or call ``key`` of ``run_id`` (the latest take)."""
        done = self.conn.execute(update(deploy_marks).where(deploy_marks.c.key == key).values(version=version, at=now))
        if done.rowcount == 0:
            try:
                with self.conn.begin_nested():
                    self.conn.execute(insert(deploy_marks).values(key=key, run_id=run_id, version=version, at=now))
            except IntegrityError:
                pass

    def version_marks(self, run_id: str) -> list[tuple[str, str]]:
        """(step or call key, version) of a run, in the order taken."""
        rows = self.conn.execute(
            select(deploy_marks.c.key, deploy_marks.c.version)
            .where(deploy_marks.c.run_id == run_id)
            .order_by(deploy_marks.c.at, deploy_marks.c.key)
        )
        return [(r.key, r.version) for r in rows]

    def runs_on_version(self, version: str, *, limit: int) -> list[Run]:
        """Unfinished runs placed on ``version``, oldest first."""
        rows = self.conn.execute(
            select(runs)
            .where(runs.c.deploy_version == version, runs.c.status.in_(_UNFINISHED))
            .order_by(runs.c.created_at, runs.c.id)
            .limit(limit)
        )
        return [run_from_row(row) for row in rows]

    def due_upgrades(self, current: str, *, limit: int) -> list[tuple[str, str]]:
        """(run id, version) of unfinished upgrading runs on another version than ``current``,
        not yet checked against it."""
        rows = self.conn.execute(
            select(runs.c.id, runs.c.deploy_version)
            .where(
                runs.c.deploy_version.is_not(None),
                runs.c.deploy_version != current,
                runs.c.status.in_(_UNFINISHED),
                runs.c.deploy_policy == "upgrade",
                or_(runs.c.deploy_checked.is_(None), runs.c.deploy_checked != current),
            )
            .order_by(runs.c.created_at, runs.c.id)
            .limit(limit)
        )
        return [(r.id, r.deploy_version) for r in rows]

    def calls_to_check(self, run_id: str, step: int) -> list[dict[str, Any]]:
        """The calls an upgrade checks: every unsettled call of the run, and the results of the
        calls of ``step`` (the step whose results the next model turn reads)."""
        rows = self.conn.execute(
            select(
                tool_calls.c.effect_key,
                tool_calls.c.tool,
                tool_calls.c.effect,
                tool_calls.c.args,
                tool_calls.c.status,
                tool_calls.c.result,
                tool_calls.c.is_error,
                tool_calls.c.step,
            )
            .where(
                tool_calls.c.run_id == run_id,
                or_(
                    tool_calls.c.status.in_(
                        ["pending", "awaiting_approval", "awaiting_variable", "started", "parked", "finished"]
                    ),
                    tool_calls.c.step == step,
                ),
            )
            .order_by(tool_calls.c.step, tool_calls.c.idx)
        )
        return [dict(r._mapping) for r in rows]

    def awaited_child_agents(self, run_id: str) -> list[str]:
        """Agent types of the run's awaited child runs that have not finished."""
        rows = self.conn.execute(
            select(agent_tool_runs.c.agent_type).where(
                agent_tool_runs.c.parent_run_id == run_id,
                agent_tool_runs.c.detached.is_(False),
                agent_tool_runs.c.finished_at.is_(None),
            )
        )
        return [r[0] for r in rows]

    def move_run_version(self, run_id: str, *, fence: int, version: str, now: datetime) -> int | None:
        """Move a run to ``version`` if ``fence`` holds and no lease is live; the new fence."""
        row = self.conn.execute(
            update(runs)
            .where(
                runs.c.id == run_id,
                runs.c.fence == fence,
                or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at <= now),
            )
            .values(
                deploy_version=version,
                deploy_pin_reason=None,
                deploy_checked=version,
                fence=runs.c.fence + 1,
                updated_at=now,
            )
            .returning(runs.c.fence)
        ).first()
        return None if row is None else int(row[0])

    def pin_run_version(self, run_id: str, *, checked: str, reason: str) -> None:
        """Record why an upgrade to ``checked`` left the run where it is."""
        self.conn.execute(
            update(runs).where(runs.c.id == run_id).values(deploy_checked=checked, deploy_pin_reason=reason[:2000])
        )

    def runs_without_live_version(self, live_versions: Sequence[str]) -> int:
        """Unfinished runs placed on a version none of ``live_versions`` is."""
        query = select(func.count()).where(runs.c.deploy_version.is_not(None), runs.c.status.in_(_UNFINISHED))
        if live_versions:
            query = query.where(and_(runs.c.deploy_version.not_in(list(live_versions))))
        return int(self.conn.execute(query).scalar() or 0)

    def reroute_outbox(self, key: str, queue: str | None) -> None:
        """Send the outbox row ``key`` to ``queue`` from now on (a run moved to another version)."""
        self.conn.execute(update(outbox).where(outbox.c.key == key).values(queue=queue))
