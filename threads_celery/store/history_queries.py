"""The named queries of retention, export and erasure (a part of :class:`~.repository.Tx`).

They work on a *tree*: a root thread and the child threads its agent tools started, found by
walking ``threads.parent_thread_id`` down (indexed), since a child is deleted with its parent
(the foreign key cascades) and must be looked at with it. Every query takes bounded lists of
ids (chunked at :data:`CHUNK`), so a batch's transaction stays short however large the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, delete, func, insert, select, tuple_
from sqlalchemy.engine import Connection

from threads_celery.records import AGENT_TOOL_STATUSES, TERMINAL_STATUSES
from threads_celery.store.schema import (
    agent_tool_runs,
    branches,
    deploy_marks,
    events,
    messages,
    milestones,
    model_usage,
    outbox,
    permission_grants,
    retention_holds,
    runs,
    threads,
    tool_calls,
    variables,
)

#: Ids per ``IN (...)``: bounded statements, whatever the size of a tree or a batch.
CHUNK = 500
#: Rows per read of a thread's messages and events when they are exported.
PAGE = 1000

#: The effects and call statuses that make a call "without an outcome" that retention must not
#: touch (threads_celery.decisions.retention holds the rule; the store cannot import it).
RISKY_EFFECTS = ("unguarded", "reconcilable")
NO_OUTCOME_STATUSES = ("started", "parked")

#: What an export holds, in the order it writes them, and the record kind of each row.
EXPORTED_TABLES: tuple[tuple[str, Table], ...] = (
    ("thread", threads),
    ("message", messages),
    ("event", events),
    ("run", runs),
    ("tool_call", tool_calls),
    ("agent_tool_run", agent_tool_runs),
    ("milestone", milestones),
    ("usage", model_usage),
    ("grant", permission_grants),
    ("variable", variables),
    ("hold", retention_holds),
    ("branch", branches),
    ("deploy_mark", deploy_marks),
)


@dataclass(frozen=True)
class TreeFacts:
    """What retention, export and erasure need to know of one root thread and its tree."""

    thread_id: str
    agent: str
    tenant: str
    created_at: datetime
    last_status: str | None
    last_activity: datetime
    unfinished_runs: tuple[str, ...]
    open_risky_calls: tuple[str, ...]
    held: bool
    tree: tuple[str, ...]


@dataclass(frozen=True)
class Hold:
    """A thread retention keeps, and who asked."""

    thread_id: str
    reason: str
    held_by: str
    held_at: datetime


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


def _row(row: Any) -> dict[str, Any]:
    return dict(row._mapping)


class HistoryQueries:
    """Queries of whole thread trees; mixed into the transaction."""

    conn: Connection
    dialect: str

    # -- trees -------------------------------------------------------------------------------

    def root_thread(self, thread_id: str) -> str | None:
        """The root of the tree ``thread_id`` is in (itself for a root), or None if no such thread."""
        current: str | None = thread_id
        seen: set[str] = set()
        while current is not None and current not in seen:
            seen.add(current)
            row = self.conn.execute(select(threads.c.parent_thread_id).where(threads.c.id == current)).first()
            if row is None:
                return None
            if row.parent_thread_id is None:
                return current
            current = row.parent_thread_id
        return current

    def thread_trees(self, roots: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Each root's tree (the root first, then its descendants, level by level)."""
        trees: dict[str, list[str]] = {root: [root] for root in roots}
        owner = {root: root for root in roots}
        frontier = list(roots)
        while frontier:
            found: list[str] = []
            for chunk in _chunks(frontier):
                rows = self.conn.execute(
                    select(threads.c.id, threads.c.parent_thread_id).where(threads.c.parent_thread_id.in_(chunk))
                )
                for child, parent in rows:
                    if child in owner:  # a cycle cannot be made through the API; never loop on one
                        continue
                    owner[child] = owner[parent]
                    trees[owner[parent]].append(child)
                    found.append(child)
            frontier = found
        return {root: tuple(tree) for root, tree in trees.items()}

    def root_page(
        self,
        *,
        after: tuple[datetime, str] | None,
        limit: int,
        created_before: datetime | None = None,
        created_from: datetime | None = None,
        tenant: str | None = None,
    ) -> list[tuple[datetime, str]]:
        """Root threads in ``(created_at, id)`` order after ``after``: one bounded step over the
        ``(created_at, id)`` index (``created_from`` included, ``created_before`` excluded)."""
        query = select(threads.c.created_at, threads.c.id).where(threads.c.parent_thread_id.is_(None))
        if after is not None:
            query = query.where(tuple_(threads.c.created_at, threads.c.id) > tuple_(*after))
        if created_before is not None:
            query = query.where(threads.c.created_at < created_before)
        if created_from is not None:
            query = query.where(threads.c.created_at >= created_from)
        if tenant is not None:
            query = query.where(threads.c.tenant == tenant)
        query = query.order_by(threads.c.created_at, threads.c.id).limit(limit)
        return [(row.created_at, row.id) for row in self.conn.execute(query)]

    def tree_facts(self, roots: Sequence[str], *, lock: bool = False, skip_locked: bool = False) -> list[TreeFacts]:
        """The facts of each root that exists, in ``roots``' order. ``lock`` locks the trees'
        thread rows (PostgreSQL; SQLite's write transaction holds the whole database), which a
        start on the thread waits for; ``skip_locked`` leaves out a root another transaction holds."""
        if not roots:
            return []
        query = select(threads).where(threads.c.id.in_(list(roots)))
        if lock and self.dialect == "postgresql":
            query = query.with_for_update(skip_locked=skip_locked)
        root_rows = {row.id: row for row in self.conn.execute(query)}
        trees = self.thread_trees([r for r in roots if r in root_rows])
        if lock and self.dialect == "postgresql":
            children = [t for tree in trees.values() for t in tree[1:]]
            for chunk in _chunks(children):
                self.conn.execute(select(threads.c.id).where(threads.c.id.in_(chunk)).with_for_update())
        owner = {t: root for root, tree in trees.items() for t in tree}
        all_ids = list(owner)
        last: dict[str, tuple[datetime, str]] = {}
        activity: dict[str, datetime] = {root: root_rows[root].created_at for root in trees}
        unfinished: dict[str, list[str]] = {root: [] for root in trees}
        risky: dict[str, list[str]] = {root: [] for root in trees}
        held: set[str] = set()
        for chunk in _chunks(all_ids):
            run_rows = self.conn.execute(
                select(runs.c.id, runs.c.thread_id, runs.c.status, runs.c.created_at, runs.c.updated_at)
                .where(runs.c.thread_id.in_(chunk))
            ).all()  # fmt: skip
            for run in run_rows:
                root = owner[run.thread_id]
                activity[root] = max(activity[root], run.updated_at)
                if run.status not in TERMINAL_STATUSES:
                    unfinished[root].append(run.id)
                if run.thread_id == root and (root not in last or run.created_at >= last[root][0]):
                    last[root] = (run.created_at, run.status)
            # By run: tool_calls has no index on its thread, and (run_id, step, idx) is unique.
            for run_chunk in _chunks([run.id for run in run_rows]):
                call_rows = self.conn.execute(
                    select(tool_calls.c.effect_key, tool_calls.c.thread_id).where(
                        tool_calls.c.run_id.in_(run_chunk),
                        tool_calls.c.effect.in_(RISKY_EFFECTS),
                        tool_calls.c.status.in_(NO_OUTCOME_STATUSES),
                    )
                )
                for key, thread_id in call_rows:
                    risky[owner[thread_id]].append(key)
            # A detached agent-tool run whose child is still going keeps its parent's tree too.
            child_rows = self.conn.execute(
                select(agent_tool_runs.c.run_id, agent_tool_runs.c.parent_thread_id).where(
                    agent_tool_runs.c.parent_thread_id.in_(chunk),
                    agent_tool_runs.c.status.in_(("starting", "running")),
                )
            )
            for run_id, thread_id in child_rows:
                unfinished[owner[thread_id]].append(run_id)
            held.update(
                owner[t]
                for t in self.conn.execute(
                    select(retention_holds.c.thread_id).where(retention_holds.c.thread_id.in_(chunk))
                ).scalars()
            )
        return [
            TreeFacts(
                thread_id=root,
                agent=root_rows[root].agent,
                tenant=root_rows[root].tenant,
                created_at=root_rows[root].created_at,
                last_status=last[root][1] if root in last else None,
                last_activity=activity[root],
                unfinished_runs=tuple(sorted(set(unfinished[root]))),
                open_risky_calls=tuple(sorted(risky[root])),
                held=root in held,
                tree=trees[root],
            )
            for root in roots
            if root in trees
        ]

    # -- export ------------------------------------------------------------------------------

    def tree_rows(self, tree: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every row of the tree's threads, as ``(kind, columns)``, table by table in
        :data:`EXPORTED_TABLES` order, each in a stable order. Values are as the store reads
        them (secret variables still sealed: the caller decides what leaves)."""
        ids = list(tree)
        for kind, table in EXPORTED_TABLES:
            if table is messages or table is events:
                for thread_id in ids:
                    yield from ((kind, r) for r in self._paged_by_seq(table, thread_id))
                continue
            if table is milestones:
                query = (
                    select(milestones)
                    .join(agent_tool_runs, agent_tool_runs.c.run_id == milestones.c.agent_tool_run_id)
                    .where(agent_tool_runs.c.parent_thread_id.in_(ids))
                    .order_by(milestones.c.agent_tool_run_id, milestones.c.sequence)
                )
            elif table is threads:
                query = select(threads).where(threads.c.id.in_(ids))
            elif table is agent_tool_runs:
                query = select(table).where(table.c.parent_thread_id.in_(ids))
            elif table is deploy_marks:  # by run, as they are indexed
                query = select(deploy_marks).where(
                    deploy_marks.c.run_id.in_(select(runs.c.id).where(runs.c.thread_id.in_(ids)).scalar_subquery())
                )
            elif table is tool_calls:  # by run: the calls' index (their thread has none)
                query = select(tool_calls).where(
                    tool_calls.c.run_id.in_(select(runs.c.id).where(runs.c.thread_id.in_(ids)).scalar_subquery())
                )
            else:
                query = select(table).where(table.c.thread_id.in_(ids))
            rows = [_row(r) for r in self.conn.execute(query.order_by(*table.primary_key.columns))]
            if table is threads:  # root first, then children as the tree lists them
                order = {t: i for i, t in enumerate(ids)}
                rows.sort(key=lambda r: order[r["id"]])
            yield from ((kind, r) for r in rows)

    def _paged_by_seq(self, table: Table, thread_id: str) -> Iterator[dict[str, Any]]:
        after = -1
        while True:
            page = self.conn.execute(
                select(table)
                .where(table.c.thread_id == thread_id, table.c.seq > after)
                .order_by(table.c.seq)
                .limit(PAGE)
            ).all()
            for row in page:
                yield _row(row)
            if len(page) < PAGE:
                return
            after = page[-1].seq

    # -- erasure -----------------------------------------------------------------------------

    def delete_trees(self, tree_ids: Sequence[str]) -> dict[str, int]:
        """Delete every row of these threads (whole trees), counted per table: their agent-tool
        runs and milestones, calls (and the deployment versions that took them), usage, outbox
        rows, events, messages, variables (secrets' ciphertexts), grants, holds, branches, runs
        and the threads themselves."""
        ids = list(dict.fromkeys(tree_ids))
        counts = {name: 0 for name in _ERASED_TABLES}
        for chunk in _chunks(ids):
            run_steps = self.conn.execute(select(runs.c.id, runs.c.step).where(runs.c.thread_id.in_(chunk))).all()
            run_ids = [run_id for run_id, _ in run_steps]
            tool_runs = list(
                self.conn.execute(
                    select(agent_tool_runs.c.run_id).where(agent_tool_runs.c.parent_thread_id.in_(chunk))
                ).scalars()
            )
            for run_chunk in _chunks(run_ids):
                tool_runs.extend(
                    self.conn.execute(
                        select(agent_tool_runs.c.run_id).where(agent_tool_runs.c.child_run_id.in_(run_chunk))
                    ).scalars()
                )
            for key_chunk in _chunks(_run_outbox_keys(run_steps, tool_runs)):
                counts["outbox"] += self._deleted(outbox, outbox.c.key.in_(key_chunk))
            # Every lookup walks an index: calls by run, agent-tool runs by parent thread or by
            # child run (a child's own record, when the child is erased without its parent).
            for run_chunk in _chunks(run_ids):
                keys = list(
                    self.conn.execute(
                        select(tool_calls.c.effect_key).where(tool_calls.c.run_id.in_(run_chunk))
                    ).scalars()
                )
                for key_chunk in _chunks(keys):
                    counts["outbox"] += self._deleted(outbox, outbox.c.key.in_(key_chunk))
                counts["tool_calls"] += self._deleted(tool_calls, tool_calls.c.run_id.in_(run_chunk))
                counts["deploy_marks"] += self._deleted(deploy_marks, deploy_marks.c.run_id.in_(run_chunk))
                mine = agent_tool_runs.c.child_run_id.in_(run_chunk)
                counts["milestones"] += self._deleted(
                    milestones, milestones.c.agent_tool_run_id.in_(select(agent_tool_runs.c.run_id).where(mine))
                )
                counts["agent_tool_runs"] += self._deleted(agent_tool_runs, mine)
            started_here = agent_tool_runs.c.parent_thread_id.in_(chunk)
            counts["milestones"] += self._deleted(
                milestones, milestones.c.agent_tool_run_id.in_(select(agent_tool_runs.c.run_id).where(started_here))
            )
            counts["agent_tool_runs"] += self._deleted(agent_tool_runs, started_here)
            counts["model_usage"] += self._deleted(model_usage, model_usage.c.thread_id.in_(chunk))
            for table in (events, messages, variables, permission_grants, retention_holds, branches, runs):
                counts[table.name] += self._deleted(table, table.c.thread_id.in_(chunk))
        # Children before parents, so that no row is left for the cascade to remove uncounted.
        for chunk in _chunks(ids[::-1]):
            counts["threads"] += self._deleted(threads, threads.c.id.in_(chunk))
        return counts

    def _deleted(self, table: Table, where: Any) -> int:
        return int(self.conn.execute(delete(table).where(where)).rowcount or 0)

    # -- holds -------------------------------------------------------------------------------

    def hold_thread(self, thread_id: str, *, reason: str, held_by: str, now: datetime) -> bool:
        """Hold the thread (a hold that exists stays as it was); whether the thread exists."""
        if self.conn.execute(select(threads.c.id).where(threads.c.id == thread_id)).first() is None:
            return False
        exists = self.conn.execute(
            select(retention_holds.c.thread_id).where(retention_holds.c.thread_id == thread_id)
        ).first()
        if exists is None:
            self.conn.execute(
                insert(retention_holds).values(thread_id=thread_id, reason=reason, held_by=held_by, held_at=now)
            )
        return True

    def release_hold(self, thread_id: str) -> bool:
        """Release the thread's hold; whether there was one."""
        return bool(self._deleted(retention_holds, retention_holds.c.thread_id == thread_id))

    def list_holds(self, *, limit: int = 1000) -> list[Hold]:
        rows = self.conn.execute(select(retention_holds).order_by(retention_holds.c.held_at).limit(limit))
        return [Hold(r.thread_id, r.reason, r.held_by, r.held_at) for r in rows]

    # -- old events ------------------------------------------------------------------------

    def last_event_before(self, cutoff: datetime) -> int | None:
        """The id of the last event created before ``cutoff``, found by bisecting the primary key
        (about 30 index probes for a billion rows; no index on ``created_at`` to keep up on every
        insert). Ids are drawn in insert order, so ``created_at`` follows them to within the few
        milliseconds between drawing an id and committing it: the boundary is that exact."""
        ends = self.conn.execute(select(func.min(events.c.id), func.max(events.c.id))).one()
        low, high = ends
        if low is None:
            return None
        first = self.conn.execute(select(events.c.created_at).where(events.c.id == low)).scalar_one()
        if first >= cutoff:
            return None
        found = int(low)
        low, high = int(low) + 1, int(high)
        while low <= high:
            middle = (low + high) // 2
            row = self.conn.execute(
                select(events.c.id, events.c.created_at).where(events.c.id >= middle).order_by(events.c.id).limit(1)
            ).first()
            if row is None or row.created_at >= cutoff:
                high = middle - 1
            else:
                found = int(row.id)
                low = int(row.id) + 1
        return found

    def delete_events_through(self, last_id: int, *, limit: int) -> int:
        """Delete up to ``limit`` of the oldest events with ids up to ``last_id``; how many."""
        oldest = select(events.c.id).where(events.c.id <= last_id).order_by(events.c.id).limit(limit)
        return self._deleted(events, events.c.id.in_(oldest.scalar_subquery()))

    def count_roots(self, *, tenant: str | None = None) -> int:
        query = select(func.count()).select_from(threads).where(threads.c.parent_thread_id.is_(None))
        if tenant is not None:
            query = query.where(threads.c.tenant == tenant)
        return int(self.conn.execute(query).scalar_one())


def _run_outbox_keys(run_steps: Sequence[tuple[str, int]], tool_runs: Sequence[str]) -> list[str]:
    """Every outbox key that can name one of these runs: each of its steps' (``step:<run>:<n>``)
    and its finish callback's (``finish:<run>``), and each agent-tool run's deliveries'
    (``deliver:<agent-tool run>:<status>``). Exact keys, so the delete walks the primary key."""
    keys: list[str] = []
    for run_id, step in run_steps:
        keys.extend(f"step:{run_id}:{n}" for n in range(max(step, 0) + 2))
        keys.append(f"finish:{run_id}")
    for tool_run in dict.fromkeys(tool_runs):
        keys.extend(f"deliver:{tool_run}:{status}" for status in AGENT_TOOL_STATUSES)
    return keys


#: The tables an erasure report counts, in the order it lists them.
_ERASED_TABLES = (
    "threads",
    "messages",
    "events",
    "runs",
    "tool_calls",
    "agent_tool_runs",
    "milestones",
    "model_usage",
    "permission_grants",
    "variables",
    "retention_holds",
    "branches",
    "deploy_marks",
    "outbox",
)

__all__ = ["CHUNK", "EXPORTED_TABLES", "HistoryQueries", "Hold", "TreeFacts"]
