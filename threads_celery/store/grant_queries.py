"""The named queries of remembered permission decisions (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection

from threads_celery.records import PermissionGrant
from threads_celery.store.schema import permission_grants


class GrantQueries:
    """Queries over ``permission_grants``; mixed into the transaction."""

    conn: Connection
    dialect: str

    def grant_tool(self, thread_id: str, tool: str, *, granted_by: str, now: datetime) -> None:
        """Remember "always allow ``tool`` on this thread" (the first grant stays as it was)."""
        exists = self.conn.execute(
            select(permission_grants.c.tool).where(
                permission_grants.c.thread_id == thread_id, permission_grants.c.tool == tool
            )
        ).first()
        if exists is None:
            self.conn.execute(
                insert(permission_grants).values(thread_id=thread_id, tool=tool, granted_by=granted_by, granted_at=now)
            )

    def granted_threads(self, thread_ids: Sequence[str], tool: str) -> set[str]:
        """Which of ``thread_ids`` remember "always allow ``tool``"."""
        if not thread_ids:
            return set()
        rows = self.conn.execute(
            select(permission_grants.c.thread_id).where(
                permission_grants.c.thread_id.in_(list(thread_ids)),
                permission_grants.c.tool == tool,
            )
        )
        return {str(r) for r in rows.scalars()}

    def list_grants(self, thread_id: str) -> list[PermissionGrant]:
        rows = self.conn.execute(
            select(permission_grants)
            .where(permission_grants.c.thread_id == thread_id)
            .order_by(permission_grants.c.tool)
        )
        return [
            PermissionGrant(thread_id=r.thread_id, tool=r.tool, granted_by=r.granted_by, granted_at=r.granted_at)
            for r in rows
        ]

    def revoke_grant(self, thread_id: str, tool: str) -> bool:
        """Forget a remembered decision; whether there was one."""
        result = self.conn.execute(
            delete(permission_grants).where(
                permission_grants.c.thread_id == thread_id, permission_grants.c.tool == tool
            )
        )
        return bool(result.rowcount)
