"""The named queries of a thread's branches (a part of :class:`~.repository.Tx`).

A rewind, regenerate or edit marks a suffix of the thread's messages ``superseded_by`` its
branch: the only update a message ever takes. Each read of a history leaves those out, so a
worker's history cache sees the suffix gone (its last message missing, or a gap in the
sequence numbers) and reads the thread again in full (:mod:`threads_celery.runtime.history`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from threads_celery.records import Branch, BranchKind, CallRow, PriorEffect
from threads_celery.store.rows import call_from_mapping
from threads_celery.store.schema import branches, messages, threads, tool_calls


def _branch_from_row(m: Any) -> Branch:
    return Branch(
        id=int(m["id"]),
        thread_id=m["thread_id"],
        kind=m["kind"],
        created_at=m["created_at"],
        from_seq=m["from_seq"],
        source_thread_id=m["source_thread_id"],
        source_seq=m["source_seq"],
        prior_effects=tuple(PriorEffect.from_json(p) for p in m["prior_effects"] or ()),
        dropped_calls=tuple(str(c) for c in m["dropped_calls"] or ()),
        inherit_grants=bool(m["inherit_grants"]),
        created_by=m["created_by"],
    )


class BranchQueries:
    """Queries over ``branches`` and the superseded mark of ``messages``; mixed into the transaction."""

    conn: Connection
    dialect: str

    def insert_branch(
        self,
        thread_id: str,
        kind: BranchKind,
        now: datetime,
        *,
        from_seq: int | None = None,
        source_thread_id: str | None = None,
        source_seq: int | None = None,
        prior_effects: Sequence[PriorEffect] = (),
        dropped_calls: Sequence[str] = (),
        inherit_grants: bool = False,
        created_by: str | None = None,
    ) -> int:
        """Record a branch of ``thread_id`` and make it the thread's current one; returns its id."""
        branch_id = self.conn.execute(
            insert(branches)
            .values(
                thread_id=thread_id,
                kind=kind,
                from_seq=from_seq,
                source_thread_id=source_thread_id,
                source_seq=source_seq,
                prior_effects=[p.to_json() for p in prior_effects],
                dropped_calls=list(dropped_calls),
                inherit_grants=inherit_grants,
                created_by=created_by,
                created_at=now,
            )
            .returning(branches.c.id)
        ).scalar_one()
        self.conn.execute(update(threads).where(threads.c.id == thread_id).values(branch=branch_id))
        return int(branch_id)

    def get_branch(self, branch_id: int) -> Branch | None:
        row = self.conn.execute(select(branches).where(branches.c.id == branch_id)).first()
        return _branch_from_row(row._mapping) if row is not None else None

    def list_branches(self, thread_id: str) -> list[Branch]:
        """The thread's branches, oldest first."""
        rows = self.conn.execute(select(branches).where(branches.c.thread_id == thread_id).order_by(branches.c.id))
        return [_branch_from_row(r._mapping) for r in rows]

    def supersede_messages(self, thread_id: str, from_seq: int, branch_id: int) -> int:
        """Mark the thread's current messages from ``from_seq`` on as left behind by ``branch_id``."""
        done = self.conn.execute(
            update(messages)
            .where(
                messages.c.thread_id == thread_id,
                messages.c.seq >= from_seq,
                messages.c.superseded_by.is_(None),
            )
            .values(superseded_by=branch_id)
        )
        return int(done.rowcount or 0)

    def superseded_run_ids(self, thread_id: str) -> set[str]:
        """The runs of the thread whose user message was left behind by a branch."""
        rows = self.conn.execute(
            select(messages.c.run_id).where(
                messages.c.thread_id == thread_id,
                messages.c.role == "user",
                messages.c.superseded_by.is_not(None),
                messages.c.run_id.is_not(None),
            )
        )
        return {r.run_id for r in rows}

    def calls_by_keys(self, effect_keys: Sequence[str]) -> list[CallRow]:
        """The ledger rows of the calls with these effect keys (those that exist), in key order given."""
        if not effect_keys:
            return []
        rows = self.conn.execute(select(tool_calls).where(tool_calls.c.effect_key.in_(list(effect_keys))))
        found = {r.effect_key: call_from_mapping(r._mapping) for r in rows}
        return [found[k] for k in effect_keys if k in found]
