"""Thread history on the client: export, read back, erase, retention holds and a prune by hand.
A mixin of :class:`~threads_celery.client.threads.Threads`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from threads_celery.exceptions import HistoryFormatError
from threads_celery.transitions import history
from threads_celery.transitions.history import ErasureReport, ExportSummary, HistoryScope
from threads_celery.transitions.history_export import HistoryFile, archive_location, read_history
from threads_celery.transitions.retention import SweepTotals, sweep

if TYPE_CHECKING:
    from threads_celery.settings import Settings
    from threads_celery.store import Store
    from threads_celery.store.history_queries import Hold


class HistoryMixin:
    """Export, erasure and retention (a mixin of :class:`~threads_celery.client.threads.Threads`)."""

    store: Store
    settings: Settings

    def export(
        self,
        target: str | IO[str],
        *,
        thread_id: str | None = None,
        tenant: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> ExportSummary:
        """Export a thread (with its agent tools' child threads), a tenant's threads or those
        created in ``[since, until)`` as JSON Lines to ``target``: a local path, an fsspec URL
        (``s3://bucket/key``) or an open text stream. The format is in ``docs/retention.md``.

        A thread given by id that is running (or has an unguarded or reconcilable call without
        an outcome) raises :class:`~threads_celery.exceptions.HistoryRefused` and nothing is
        written; in a tenant or a range such threads are left out and listed in the end line.
        """
        scope = HistoryScope(thread_id=thread_id, tenant=tenant, since=since, until=until)
        now = datetime.now(UTC)
        if isinstance(target, str):
            return history.export_history(self.store, scope, target, now=now, storage_options=storage_options)
        return history.export_to_stream(self.store, scope, target, now=now)

    def read_export(self, source: str, *, storage_options: Mapping[str, Any] | None = None) -> HistoryFile:
        """An export file read back (a local path or an fsspec URL)."""
        return read_history(source, storage_options)

    def read_archive(self, thread_id: str, *, tenant: str = "default") -> HistoryFile:
        """The archive retention wrote of ``thread_id`` (``action: archive``), read back: the same
        rows, column for column, as an export of the thread made before it was pruned."""
        policy = self.settings.retention
        if not policy.archive_url:
            raise HistoryFormatError("no archive is configured (THREADS_RETENTION's archive_url)")
        return read_history(archive_location(policy.archive_url, tenant, thread_id), policy.archive_options)

    def erase(self, *, thread_id: str | None = None, tenant: str | None = None) -> ErasureReport:
        """Remove a thread (with its child threads) or every thread of a tenant: messages, events,
        runs, calls, agent-tool runs and milestones, usage, grants, variables (secrets'
        ciphertexts), outbox rows, retention holds and attachment files. Returns what it removed.

        A thread given by id that is running, has a call without an outcome or is held raises
        :class:`~threads_celery.exceptions.HistoryRefused` and nothing is removed; in a tenant
        those are left and listed in the report's ``refused``."""
        scope = HistoryScope(thread_id=thread_id, tenant=tenant)
        return history.erase_history(self.store, scope, now=datetime.now(UTC), files_root=self.settings.files_root)

    def hold(self, thread_id: str, *, reason: str, held_by: str) -> None:
        """Keep ``thread_id`` (and its child threads) from retention until :meth:`release_hold`."""
        history.hold(self.store, thread_id, reason=reason, held_by=held_by, now=datetime.now(UTC))

    def release_hold(self, thread_id: str) -> bool:
        """Let retention prune ``thread_id`` again; whether it was held."""
        return history.release(self.store, thread_id)

    def holds(self) -> list[Hold]:
        """The threads held from retention, oldest hold first."""
        with self.store.read() as tx:
            return tx.list_holds()

    def prune(self, *, dry_run: bool = True, now: datetime | None = None) -> SweepTotals:
        """Run a whole retention sweep here, batch by batch, under the settings' policy
        (``THREADS_RETENTION``). A dry run (the default) says what is due and changes nothing."""
        policy = self.settings.retention
        return sweep(
            self.store, policy, now=now or datetime.now(UTC), dry_run=dry_run,
            storage_options=policy.archive_options, files_root=self.settings.files_root,
        )  # fmt: skip
