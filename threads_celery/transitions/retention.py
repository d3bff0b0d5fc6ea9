"""The retention sweep's shell: load one batch, decide (pure: decisions/retention.py), apply.

A batch is at most ``policy.batch_size`` root threads, taken oldest first over the
``threads(created_at, id)`` index, from a cursor (the last thread the batch before it looked at)
and only among threads created before ``now - shortest keep`` (younger ones cannot be due).
Deciding reads the trees' facts outside any transaction; pruning is one short transaction per
batch that locks the doomed trees (skipping any another transaction holds), decides again on what
it reads under the lock, and deletes only what is still due: a run started meanwhile keeps its
thread. ``archive`` first writes each doomed tree as an export file (see
:func:`~threads_celery.transitions.history_export.archive_location`); a tree whose facts moved
between its archive and the delete is kept, and its archive is written again next time.

A sweep that finds nothing due changes nothing: a second sweep right after a first does nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from threads_celery.decisions.retention import Keep, Prune, RetentionDecision, RetentionPolicy, sweep_decisions
from threads_celery.store import Store
from threads_celery.store.history_queries import TreeFacts
from threads_celery.transitions.history import remove_files
from threads_celery.transitions.history_export import ExportWriter, archive_location, open_text

log = logging.getLogger("threads_celery.retention")

Cursor = tuple[datetime, str]


@dataclass(frozen=True)
class SweepBatch:
    """What one batch decided and did; ``next_after`` is where the next batch starts (None: done)."""

    decisions: tuple[RetentionDecision, ...]
    pruned: tuple[str, ...]
    archived: tuple[str, ...]
    rows: Mapping[str, int]
    next_after: Cursor | None
    dry_run: bool

    @property
    def due(self) -> tuple[Prune, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Prune))


@dataclass
class SweepTotals:
    """A whole sweep's batches added up."""

    examined: int = 0
    due: int = 0
    pruned: list[str] = field(default_factory=list)
    archived: list[str] = field(default_factory=list)
    kept: list[Keep] = field(default_factory=list)
    rows: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    dry_run: bool = False
    #: Old events deleted, and the last id the events' cutoff reached.
    events: int = 0
    events_through: int | None = None

    def add(self, batch: SweepBatch) -> None:
        self.batches += 1
        self.examined += len(batch.decisions)
        self.due += len(batch.due)
        self.pruned.extend(batch.pruned)
        self.archived.extend(batch.archived)
        self.kept.extend(d for d in batch.decisions if isinstance(d, Keep))
        self.rows.update(batch.rows)


def _archive(
    store: Store, policy: RetentionPolicy, facts: TreeFacts, now: datetime, options: Mapping[str, Any] | None
) -> str:
    assert policy.archive_url is not None
    location = archive_location(policy.archive_url, facts.tenant, facts.thread_id)
    with store.read() as tx, open_text(location, "w", options) as stream:
        writer = ExportWriter(stream)
        writer.header({"thread": facts.thread_id, "archived_by": "retention"}, now)
        writer.tree(facts.thread_id, tx.tree_rows(facts.tree))
        writer.end()
    return location


def sweep_batch(
    store: Store,
    policy: RetentionPolicy,
    *,
    now: datetime,
    after: Cursor | None = None,
    dry_run: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    files_root: str | None = None,
) -> SweepBatch:
    """One bounded batch of the sweep (``dry_run`` None: the policy's). The pruned threads'
    attachment folders under ``files_root`` go too, once their rows are gone."""
    dry = policy.dry_run if dry_run is None else dry_run
    shortest = policy.shortest_keep
    if shortest is None:  # nothing can ever be due
        return SweepBatch((), (), (), {}, None, dry)
    with store.read() as tx:
        page = tx.root_page(after=after, limit=policy.batch_size, created_before=now - shortest)
        facts = tx.tree_facts([thread_id for _, thread_id in page])
    decisions = sweep_decisions(facts, policy, now)
    next_after = page[-1] if len(page) == policy.batch_size else None
    due = {d.thread_id: d for d in decisions if isinstance(d, Prune)}
    if dry or not due:
        return SweepBatch(decisions, (), (), {}, next_after, dry)
    seen = {f.thread_id: f for f in facts}
    archived: dict[str, str] = {}
    if policy.action == "archive":
        for thread_id in due:
            archived[thread_id] = _archive(store, policy, seen[thread_id], now, storage_options)
    pruned: list[str] = []
    with store.transaction() as tx:
        doomed: list[str] = []
        for fresh in tx.tree_facts(list(due), lock=True, skip_locked=True):
            again = sweep_decisions([fresh], policy, now)[0]
            if not isinstance(again, Prune) or fresh.last_activity != seen[fresh.thread_id].last_activity:
                continue  # it moved since it was decided (or archived): the next sweep looks again
            if fresh.tree != seen[fresh.thread_id].tree:
                continue  # a child thread appeared after the archive was written
            doomed.extend(fresh.tree)
            pruned.append(fresh.thread_id)
        rows = tx.delete_trees(doomed) if doomed else {}
    files = remove_files(files_root, tuple(doomed))
    if files:
        rows = {**rows, "files": files}
    if pruned:
        log.info("retention: pruned %d threads (%s)", len(pruned), policy.action)
    return SweepBatch(
        decisions, tuple(pruned), tuple(archived[t] for t in pruned if t in archived), rows, next_after, dry
    )


@dataclass(frozen=True)
class EventsBatch:
    """One batch of old events: how many went (or, in a dry run, the last id that would)."""

    deleted: int
    through_id: int | None
    more: bool
    dry_run: bool


def trim_events_batch(
    store: Store, policy: RetentionPolicy, *, now: datetime, dry_run: bool | None = None
) -> EventsBatch:
    """Delete one batch of the events older than ``policy.events_keep``, oldest first, in a
    transaction of its own (what dropping a day's partition would do, in bounded steps)."""
    dry = policy.dry_run if dry_run is None else dry_run
    if policy.events_keep is None:
        return EventsBatch(0, None, False, dry)
    with store.read() as tx:
        through = tx.last_event_before(now - policy.events_keep)
    if through is None or dry:
        return EventsBatch(0, through, False, dry)
    with store.transaction() as tx:
        deleted = tx.delete_events_through(through, limit=policy.events_batch_size)
    return EventsBatch(deleted, through, deleted == policy.events_batch_size, dry)


def sweep(
    store: Store,
    policy: RetentionPolicy,
    *,
    now: datetime,
    dry_run: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    max_batches: int | None = None,
    files_root: str | None = None,
) -> SweepTotals:
    """Every batch of a sweep in this process, one after another (the CLI's ``prune``)."""
    totals = SweepTotals(dry_run=policy.dry_run if dry_run is None else dry_run)
    after: Cursor | None = None
    while True:
        batch = sweep_batch(
            store, policy, now=now, after=after, dry_run=dry_run, storage_options=storage_options, files_root=files_root
        )
        totals.add(batch)
        after = batch.next_after
        if max_batches is not None and totals.batches >= max_batches:
            return totals
        if after is None:
            break
        if not totals.dry_run:
            time.sleep(policy.pause_s)
    while True:
        trimmed = trim_events_batch(store, policy, now=now, dry_run=dry_run)
        totals.events += trimmed.deleted
        totals.events_through = trimmed.through_id
        if not trimmed.more:
            return totals
        if not totals.dry_run:
            time.sleep(policy.pause_s)


__all__ = ["Cursor", "EventsBatch", "SweepBatch", "SweepTotals", "sweep", "sweep_batch", "trim_events_batch"]
