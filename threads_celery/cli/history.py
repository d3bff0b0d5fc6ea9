"""``threads-celery history export|erase|prune|hold|release|holds``: a ledger's history by hand.

``export`` writes JSON Lines (a header with the format version, one line per row, an end line
with the counts) to a file, to standard output (``-``) or to an fsspec URL (``s3://...``).
``erase`` removes a thread (with its child threads) or a tenant and prints what it removed, as
JSON, for the record. ``prune`` runs the retention sweep of ``THREADS_RETENTION`` here, batch by
batch; ``--dry-run`` lists what is due and changes nothing. ``hold`` keeps a thread from retention
until ``release``. A thread that is running is refused, with the reason, and left as it is
(exit 2); an erase or export of a tenant that had to leave some threads out exits 1.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from threads_celery.cli.common import (
    EXIT_RUN_FAILED,
    EmbeddedDb,
    JsonFlag,
    UsageError,
    friendly_errors,
    open_threads,
    out,
    principal_of_this_user,
)

history_app = typer.Typer(
    help="Export, erase and prune thread history; hold a thread from retention.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

ThreadOpt = Annotated[str | None, typer.Option("--thread", help="One thread (with its agent tools' child threads).")]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Every thread of this tenant.")]


def _when(raw: str | None, option: str) -> datetime | None:
    if raw is None:
        return None
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"{option} must be an ISO 8601 date or time (2026-12-01, 2026-12-01T08:00Z), not {raw!r}"
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _options(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise UsageError('--storage-options must be a JSON object, e.g. \'{"endpoint_url": "http://localhost:9000"}\'')
    return value


def _print(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


@history_app.command("export")
@friendly_errors
def export(
    to: Annotated[str, typer.Option("--to", help="A file, - for standard output, or an fsspec URL (s3://bucket/key).")],
    thread: ThreadOpt = None,
    tenant: TenantOpt = None,
    since: Annotated[str | None, typer.Option("--since", help="Threads created at or after (ISO 8601, UTC).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Threads created before (ISO 8601, UTC).")] = None,
    storage_options: Annotated[
        str | None, typer.Option("--storage-options", help="fsspec options for a URL, as JSON.")
    ] = None,
    db: EmbeddedDb = None,
) -> None:
    """Export a thread, a tenant or a time range as JSON Lines (messages, events, runs, calls
    with their outcomes, agent-tool runs, usage, grants, variables without secrets' values)."""
    threads = open_threads(db, need_broker=False)
    try:
        scope: dict[str, Any] = {
            "thread_id": thread, "tenant": tenant, "since": _when(since, "--since"), "until": _when(until, "--until"),
        }  # fmt: skip
        if to == "-":
            summary = threads.export(sys.stdout, **scope)
        else:
            summary = threads.export(to, storage_options=_options(storage_options), **scope)
            _print({"location": summary.location, "threads": len(summary.threads), "rows": dict(summary.rows),
                    "refused": [{"thread": t, "reason": r} for t, r in summary.refused]})  # fmt: skip
    finally:
        threads.close()
    if summary.refused:
        raise typer.Exit(EXIT_RUN_FAILED)


@history_app.command("erase")
@friendly_errors
def erase(
    thread: ThreadOpt = None,
    tenant: TenantOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask before erasing.")] = False,
    db: EmbeddedDb = None,
) -> None:
    """Erase a thread (with its child threads) or a tenant: every row of theirs (secrets'
    ciphertexts, usage, grants, outbox rows included) and their attachment files. Prints the
    report of what was removed."""
    if (thread is None) == (tenant is None):
        raise UsageError("give --thread or --tenant (one of them)")
    what = f"thread {thread}" if thread is not None else f"every thread of tenant {tenant}"
    if not yes and not typer.confirm(f"Erase {what}? This cannot be undone.", err=True):
        raise typer.Exit(EXIT_RUN_FAILED)
    threads = open_threads(db, need_broker=False)
    try:
        report = threads.erase(thread_id=thread, tenant=tenant)
    finally:
        threads.close()
    _print(report.as_dict())
    if report.refused:
        raise typer.Exit(EXIT_RUN_FAILED)


@history_app.command("prune")
@friendly_errors
def prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what is due; change nothing.")] = False,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """Run the retention sweep of THREADS_RETENTION now, in bounded batches."""
    threads = open_threads(db, need_broker=False)
    try:
        if not threads.settings.retention.enabled:
            raise UsageError("no retention policy is set (THREADS_RETENTION): everything is kept")
        totals = threads.prune(dry_run=dry_run)
    finally:
        threads.close()
    data = {
        "dry_run": totals.dry_run, "examined": totals.examined, "due": totals.due, "pruned": totals.pruned,
        "archived": totals.archived, "rows": dict(totals.rows), "batches": totals.batches,
        "events_deleted": totals.events, "events_through_id": totals.events_through,
    }  # fmt: skip
    if as_json:
        _print(data)
        return
    verb = "would prune" if totals.dry_run else "pruned"
    count = totals.due if totals.dry_run else len(totals.pruned)
    out.print(f"examined {totals.examined} threads in {totals.batches} batches; {verb} {count}")
    if totals.events_through is not None:
        what = "would delete the events" if totals.dry_run else f"deleted {totals.events} events"
        out.print(f"{what} through id {totals.events_through}")
    for kept in totals.kept:
        if "not due" not in kept.reason and "for good" not in kept.reason:
            out.print(f"  kept {kept.thread_id}: {kept.reason}")


@history_app.command("hold")
@friendly_errors
def hold(
    thread: Annotated[str, typer.Argument(help="The thread to keep.")],
    reason: Annotated[str, typer.Option("--reason", help="Why it is kept (a case, a legal hold).")],
    principal: Annotated[str | None, typer.Option("--principal", help="Who holds it [default: this user].")] = None,
    db: EmbeddedDb = None,
) -> None:
    """Keep a thread (and its child threads) from retention until `history release`."""
    threads = open_threads(db, need_broker=False)
    try:
        threads.hold(thread, reason=reason, held_by=principal or principal_of_this_user())
    finally:
        threads.close()
    out.print(f"held {thread}")


@history_app.command("release")
@friendly_errors
def release(thread: Annotated[str, typer.Argument(help="The held thread.")], db: EmbeddedDb = None) -> None:
    """Let retention prune a held thread again."""
    threads = open_threads(db, need_broker=False)
    try:
        had = threads.release_hold(thread)
    finally:
        threads.close()
    out.print(f"released {thread}" if had else f"{thread} was not held")


@history_app.command("holds")
@friendly_errors
def holds(db: EmbeddedDb = None, as_json: JsonFlag = False) -> None:
    """List the threads held from retention."""
    threads = open_threads(db, need_broker=False)
    try:
        found = threads.holds()
    finally:
        threads.close()
    rows = [
        {"thread": h.thread_id, "reason": h.reason, "held_by": h.held_by, "held_at": h.held_at.isoformat()}
        for h in found
    ]
    if as_json:
        _print(rows)
        return
    for row in rows:
        out.print(f"{row['thread']}  {row['held_at']}  {row['held_by']}: {row['reason']}")
