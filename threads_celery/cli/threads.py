"""``threads-celery thread messages/branches/rewind/fork``: a thread's history and its branches.

A rewind goes on from a message in place and keeps what followed as a superseded branch; a fork
copies the history through a message onto a new thread and leaves the source alone. Both read
and write the ledger only (no broker): the next run on the thread, started as usual, goes on from
the branch. The rules are :mod:`threads_celery.transitions.branches`'.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from threads_celery.cli.common import (
    EmbeddedDb,
    JsonFlag,
    embedded_db_missing,
    friendly_errors,
    jsonable,
    message_to_json,
    open_threads,
    out,
    principal_of_this_user,
)
from threads_celery.exceptions import ThreadNotFound
from threads_celery.records import Branch

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

thread_app = typer.Typer(
    help=(
        "A thread's history and its branches: rewind in place, fork onto a new thread.\n\n\b\n"
        "  threads-celery thread messages thread_3f2a... --all\n"
        "  threads-celery thread rewind thread_3f2a... --at 3\n"
        "  threads-celery thread fork thread_3f2a... --at 3 --to thread_copy"
    ),
    no_args_is_help=True,
)
ThreadArg = Annotated[str, typer.Argument(metavar="THREAD_ID", show_default=False)]
AtOption = Annotated[
    int,
    typer.Option("--at", min=-1, help="The seq of the last message kept (-1: none).", show_default=False),
]


def _existing(threads: Threads, thread_id: str) -> None:
    if threads.tenant_of(thread_id=thread_id) is None:
        raise ThreadNotFound(thread_id)


def _branch_json(branch: Branch) -> dict[str, object]:
    data = jsonable(
        {
            "id": branch.id,
            "thread_id": branch.thread_id,
            "kind": branch.kind,
            "from_seq": branch.from_seq,
            "source_thread_id": branch.source_thread_id,
            "source_seq": branch.source_seq,
            "prior_effects": [p.to_json() for p in branch.prior_effects],
            "dropped_calls": list(branch.dropped_calls),
            "inherit_grants": branch.inherit_grants,
            "created_by": branch.created_by,
            "created_at": branch.created_at,
        }
    )
    assert isinstance(data, dict)
    return data


def _say(branch: Branch) -> None:
    where = (
        f"from message {branch.from_seq} on is kept as branch {branch.id}'s past"
        if branch.from_seq is not None
        else f"copied from {branch.source_thread_id} through message {branch.source_seq}"
    )
    out.print(f"{escape(branch.kind)} of {escape(branch.thread_id)}: {escape(where)}")
    for key in branch.dropped_calls:
        out.print(f"  dropped (had no result): {escape(key)}")
    for effect in branch.prior_effects:
        out.print(f"  prior effect, asks before {escape(effect.tool)} runs again: {escape(effect.effect_key)}")


@thread_app.command("messages")
@friendly_errors
def thread_messages(
    thread_id: ThreadArg,
    all_branches: Annotated[bool, typer.Option("--all", help="Also the messages branches left behind.")] = False,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """The thread's messages, in order: its current branch (--all: every message it had)."""
    if embedded_db_missing(db) is not None:
        raise ThreadNotFound(thread_id)
    threads = open_threads(db, need_broker=False)
    try:
        _existing(threads, thread_id)
        found = threads.messages(thread_id, include_superseded=all_branches)
    finally:
        threads.close()
    if as_json:
        rows = [{**message_to_json(m), "superseded_by": m.superseded_by} for m in found]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table("seq", "role", "text", "branch left", box=None)
    for m in found:
        text = m.text or ", ".join(c.name for c in m.tool_calls)
        left = "" if m.superseded_by is None else str(m.superseded_by)
        table.add_row(str(m.seq), m.role, escape(text[:80]), left)
    out.print(table)


@thread_app.command("branches")
@friendly_errors
def thread_branches(thread_id: ThreadArg, db: EmbeddedDb = None, as_json: JsonFlag = False) -> None:
    """The thread's branches, oldest first."""
    if embedded_db_missing(db) is not None:
        raise ThreadNotFound(thread_id)
    threads = open_threads(db, need_broker=False)
    try:
        _existing(threads, thread_id)
        found = threads.branches(thread_id)
    finally:
        threads.close()
    if as_json:
        sys.stdout.write(json.dumps([_branch_json(b) for b in found], indent=2) + "\n")
        return
    if not found:
        out.print(f"thread {escape(thread_id)} has no branches")
    for branch in found:
        _say(branch)


@thread_app.command("rewind")
@friendly_errors
def thread_rewind(thread_id: ThreadArg, at: AtOption, db: EmbeddedDb = None, as_json: JsonFlag = False) -> None:
    """Go on from message --at in place: what followed is kept as a superseded branch.

    Refused while a run of the thread is in progress.

    \b
      threads-celery thread rewind thread_3f2a... --at 3
    """
    if embedded_db_missing(db) is not None:
        raise ThreadNotFound(thread_id)
    threads = open_threads(db, need_broker=False)
    try:
        branch = threads.rewind(thread_id, None if at < 0 else at, by=principal_of_this_user())
    finally:
        threads.close()
    if as_json:
        sys.stdout.write(json.dumps(None if branch is None else _branch_json(branch), indent=2) + "\n")
    elif branch is None:
        out.print(f"nothing follows message {at} of {escape(thread_id)}: nothing changed")
    else:
        _say(branch)


@thread_app.command("fork")
@friendly_errors
def thread_fork(
    thread_id: ThreadArg,
    at: AtOption,
    to: Annotated[str | None, typer.Option("--to", help="The new thread's id (default: a new one).")] = None,
    inherit_grants: Annotated[
        bool, typer.Option("--inherit-grants", help="Copy the thread's remembered 'always allow' grants.")
    ] = False,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """A new thread whose history is a copy through message --at; the source is left as it is.

    \b
      threads-celery thread fork thread_3f2a... --at 3 --to thread_try_again
    """
    if embedded_db_missing(db) is not None:
        raise ThreadNotFound(thread_id)
    threads = open_threads(db, need_broker=False)
    try:
        branch = threads.fork(
            thread_id,
            None if at < 0 else at,
            new_thread_id=to,
            inherit_grants=inherit_grants,
            by=principal_of_this_user(),
        )
    finally:
        threads.close()
    if as_json:
        sys.stdout.write(json.dumps(_branch_json(branch), indent=2) + "\n")
    else:
        _say(branch)
