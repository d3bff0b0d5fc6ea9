"""Export and erasure of thread history, and retention holds: what the client and the CLI call.

Both work on whole trees (a thread and the child threads of its agent tools) in bounded batches,
each batch its own short transaction. Neither touches a tree that :func:`~threads_celery.decisions.
retention.refusal` refuses (a run not finished, an unguarded or reconcilable call without an
outcome): a thread asked for by id is refused with :class:`~threads_celery.exceptions.
HistoryRefused`, and nothing is written or removed; in a tenant or a time range the refused
trees are listed (in the export's end line, in the erasure report) and the rest is done.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from threads_celery.decisions.retention import refusal
from threads_celery.exceptions import ConfigError, HistoryRefused, ThreadNotFound
from threads_celery.store import Store
from threads_celery.store.history_queries import TreeFacts
from threads_celery.transitions.history_export import ExportWriter, open_text

log = logging.getLogger("threads_celery.history")

#: Root threads per batch of a tenant's or a time range's export or erasure.
HISTORY_BATCH = 50


@dataclass(frozen=True)
class HistoryScope:
    """Which trees: one thread (and its children), or a tenant's and/or a creation time range."""

    thread_id: str | None = None
    tenant: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.thread_id is not None and (self.tenant, self.since, self.until) != (None, None, None):
            raise ConfigError("give a thread, or a tenant and/or a time range, not both")
        if (self.thread_id, self.tenant, self.since, self.until) == (None, None, None, None):
            raise ConfigError("give a thread, a tenant or a time range (since/until)")
        for name in ("since", "until"):
            at = getattr(self, name)
            if at is not None and at.tzinfo is None:
                raise ConfigError(f"{name} must be an aware datetime (UTC), not a naive one")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError("since must be before until")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.thread_id is not None:
            out["thread"] = self.thread_id
        if self.tenant is not None:
            out["tenant"] = self.tenant
        if self.since is not None:
            out["since"] = self.since.astimezone(UTC).isoformat()
        if self.until is not None:
            out["until"] = self.until.astimezone(UTC).isoformat()
        return out


def _root_batches(store: Store, scope: HistoryScope) -> Iterator[list[str]]:
    """The scope's trees, as batches of root ids (one thread: its own subtree)."""
    if scope.thread_id is not None:
        with store.read() as tx:
            if tx.get_thread(scope.thread_id) is None:
                raise ThreadNotFound(scope.thread_id)
        yield [scope.thread_id]
        return
    after: tuple[datetime, str] | None = None
    while True:
        with store.read() as tx:
            page = tx.root_page(
                after=after,
                limit=HISTORY_BATCH,
                created_from=scope.since,
                created_before=scope.until,
                tenant=scope.tenant,
            )
        if not page:
            return
        yield [thread_id for _, thread_id in page]
        if len(page) < HISTORY_BATCH:
            return
        after = page[-1]


def _refused(facts: TreeFacts, *, erasing: bool) -> str | None:
    reason = refusal(facts)
    if reason is None and erasing and facts.held:
        reason = f"thread {facts.thread_id} is held for retention; release the hold to erase it"
    return reason


# -- export ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote, and where."""

    location: str
    threads: tuple[str, ...]
    rows: Mapping[str, int]
    refused: tuple[tuple[str, str], ...]


def export_to_stream(store: Store, scope: HistoryScope, stream: IO[str], *, now: datetime) -> ExportSummary:
    """Write the scope's history to ``stream`` (see :mod:`.history_export` for the format)."""
    writer = ExportWriter(stream)
    header_written = False
    for roots in _root_batches(store, scope):
        with store.read() as tx:
            for facts in tx.tree_facts(roots):
                reason = _refused(facts, erasing=False)
                if reason is not None and scope.thread_id is not None:
                    raise HistoryRefused(facts.thread_id, f"not exported: {reason}")
                if not header_written:
                    writer.header(scope.as_dict(), now)
                    header_written = True
                if reason is not None:
                    writer.refuse(facts.thread_id, reason)
                    continue
                writer.tree(facts.thread_id, tx.tree_rows(facts.tree))
    if not header_written:
        writer.header(scope.as_dict(), now)
    writer.end()
    return ExportSummary(
        location=getattr(stream, "name", "<stream>"),
        threads=tuple(writer.roots),
        rows=dict(writer.counts),
        refused=tuple((r["thread"], r["reason"]) for r in writer.refused),
    )


def export_history(
    store: Store,
    scope: HistoryScope,
    target: str,
    *,
    now: datetime,
    storage_options: Mapping[str, Any] | None = None,
) -> ExportSummary:
    """Export to ``target`` (a local path or an fsspec URL). A thread asked for by id that is
    refused raises HistoryRefused before anything is written."""
    if scope.thread_id is not None:  # refuse before a file is made
        with store.read() as tx:
            found = tx.tree_facts([scope.thread_id])
        if not found:
            raise ThreadNotFound(scope.thread_id)
        reason = _refused(found[0], erasing=False)
        if reason is not None:
            raise HistoryRefused(scope.thread_id, f"not exported: {reason}")
    with open_text(target, "w", storage_options) as stream:
        summary = export_to_stream(store, scope, stream, now=now)
    return ExportSummary(target, summary.threads, summary.rows, summary.refused)


# -- erasure -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErasureReport:
    """What an erasure removed: the threads (children included), the rows per table, the
    attachment files, and what it refused and why. ``as_dict()`` is the auditable record."""

    scope: Mapping[str, Any]
    started_at: datetime
    finished_at: datetime
    threads: tuple[str, ...]
    rows: Mapping[str, int]
    files: int
    refused: tuple[tuple[str, str], ...] = field(default=())

    @property
    def complete(self) -> bool:
        """Whether everything in scope was erased (nothing refused)."""
        return not self.refused

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": dict(self.scope),
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "threads": list(self.threads),
            "rows": dict(self.rows),
            "files": self.files,
            "refused": [{"thread": t, "reason": r} for t, r in self.refused],
        }


def remove_files(files_root: str | None, thread_ids: tuple[str, ...]) -> int:
    """Remove the threads' attachment folders; how many files they held."""
    if not files_root:
        return 0
    from threads_celery.workspace.files import area_name

    removed = 0
    for thread_id in thread_ids:
        area = Path(files_root) / area_name(thread_id)
        if area.is_dir():
            removed += sum(1 for p in area.rglob("*") if p.is_file())
            shutil.rmtree(area, ignore_errors=True)
    return removed


def erase_history(
    store: Store, scope: HistoryScope, *, now: datetime, files_root: str | None = None, clock: Any = None
) -> ErasureReport:
    """Remove the scope's threads with everything of theirs (see ``Tx.delete_trees``), and their
    attachment folders under ``files_root``. A thread asked for by id that is refused (running,
    a call without an outcome, held) raises HistoryRefused and nothing is removed."""
    started = now
    erased: list[str] = []
    rows: Counter[str] = Counter()
    refused: list[tuple[str, str]] = []
    for roots in _root_batches(store, scope):
        with store.transaction() as tx:
            doomed: list[str] = []
            for facts in tx.tree_facts(roots, lock=True):
                reason = _refused(facts, erasing=True)
                if reason is not None:
                    if scope.thread_id is not None:
                        raise HistoryRefused(facts.thread_id, f"not erased: {reason}")
                    refused.append((facts.thread_id, reason))
                    continue
                doomed.extend(facts.tree)
            if doomed:
                rows.update(tx.delete_trees(doomed))
        erased.extend(doomed)
    files = remove_files(files_root, tuple(erased))
    finished = clock() if clock is not None else datetime.now(UTC)
    report = ErasureReport(
        scope=scope.as_dict(), started_at=started, finished_at=finished, threads=tuple(erased),
        rows={k: v for k, v in rows.items()}, files=files, refused=tuple(refused),
    )  # fmt: skip
    log.warning("erasure: %s", json.dumps(report.as_dict(), sort_keys=True))
    return report


# -- holds -------------------------------------------------------------------------------------


def hold(store: Store, thread_id: str, *, reason: str, held_by: str, now: datetime) -> None:
    """Keep the thread (and its tree) from retention until :func:`release`."""
    if not reason.strip() or not held_by.strip():
        raise ConfigError("a hold needs a reason and who holds it")
    with store.transaction() as tx:
        if not tx.hold_thread(thread_id, reason=reason[:2000], held_by=held_by[:255], now=now):
            raise ThreadNotFound(thread_id)


def release(store: Store, thread_id: str) -> bool:
    """Release the thread's hold; whether it had one."""
    with store.transaction() as tx:
        return tx.release_hold(thread_id)


__all__ = [
    "ErasureReport",
    "ExportSummary",
    "HistoryScope",
    "erase_history",
    "export_history",
    "export_to_stream",
    "hold",
    "release",
    "remove_files",
]
