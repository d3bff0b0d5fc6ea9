"""``threads-celery runs list/show/cancel`` and ``threads-celery events``: reading the ledger."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from threads_celery.cli.common import (
    EmbeddedDb,
    JsonFlag,
    UsageError,
    agent_tool_run_to_json,
    agent_tool_runs_of,
    embedded_db_missing,
    friendly_errors,
    jsonable,
    message_to_json,
    open_threads,
    out,
    run_to_json,
)
from threads_celery.cli.live import STATUS_STYLES, RunView, shorten
from threads_celery.cli.watch import follow_thread
from threads_celery.exceptions import RunNotFound, ThreadNotFound
from threads_celery.records import ACTIVE_STATUSES, TERMINAL_STATUSES, Event, Run, UsageTotals

ALL_STATUSES = sorted(ACTIVE_STATUSES | TERMINAL_STATUSES)
#: Columns ``runs list`` needs beside its ids and statuses for a table (agent, took, some input).
TABLE_ROOM = 36
#: The thread's runs whose answered calls a replay notes (the newest ones).
REPLAYED_RUNS = 1000

runs_app = typer.Typer(
    help=(
        "List, inspect and cancel runs.\n\n\b\n  threads-celery runs list --status running\n"
        "  threads-celery runs show run_3f2a...\n  threads-celery runs cancel run_3f2a..."
    ),
    no_args_is_help=True,
)


@runs_app.command("list")
@friendly_errors
def runs_list(
    thread: Annotated[str | None, typer.Option("--thread", help="Only runs of this thread.")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help=f"Only runs in this status ({', '.join(ALL_STATUSES)}).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many, newest first.")] = 20,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """List recent runs, newest first.

    \b
      threads-celery runs list
      threads-celery runs list --status parked --json
      threads-celery runs list --thread thread_9c1e... -n 5
    """
    if status is not None and status not in ALL_STATUSES:
        raise UsageError(f"unknown status {status!r}; one of: {', '.join(ALL_STATUSES)}")
    if embedded_db_missing(db) is not None:
        found: list[Run] = []
    else:
        threads = open_threads(db, need_broker=False)
        try:
            found = threads.runs(thread_id=thread, status=status, limit=limit)
        finally:
            threads.close()
    if as_json:
        sys.stdout.write(json.dumps([run_to_json(r) for r in found], indent=2) + "\n")
        return
    if not found:
        out.print("no runs", style="dim")
        return
    id_width = max(len(r.id) for r in found)
    status_width = max(len(r.status) for r in found)
    if out.width < id_width + status_width + TABLE_ROOM:
        # Too narrow for a table that keeps every id whole: one block per run, the id on a line
        # of its own (never cut: it is what the other commands take).
        for r in found:
            out.print(Text(r.id, style="bold"), soft_wrap=True)
            took = _took(r)
            out.print(
                Text.assemble(
                    "    ", (r.status, STATUS_STYLES.get(r.status, "")), "  ", r.agent, (f"  {took}" if took else "")
                ),
                soft_wrap=True,
            )
            out.print(
                Text.assemble(("    input  ", "dim"), " ".join(r.input.split())), overflow="ellipsis", no_wrap=True
            )
        return
    wide = out.width >= 110  # a narrow terminal drops the creation time rather than squeeze the ids
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run", no_wrap=True, overflow="fold", min_width=id_width)
    table.add_column("status", no_wrap=True, min_width=status_width)
    table.add_column("agent", no_wrap=True, min_width=min(16, max(len(r.agent) for r in found)))
    if wide:
        table.add_column("created", no_wrap=True, min_width=14)
    table.add_column("took", no_wrap=True, justify="right", min_width=5)
    table.add_column("input", overflow="ellipsis", no_wrap=True, ratio=1)
    for r in found:
        took = _took(r)
        created = [r.created_at.strftime("%m-%d %H:%M:%S") if r.created_at else ""] if wide else []
        table.add_row(
            r.id,
            Text(r.status, style=STATUS_STYLES.get(r.status, "")),
            r.agent,
            *created,
            took,
            Text(" ".join(r.input.split())),
        )
    out.print(table)


def _took(run: Run) -> str:
    if run.finished_at is None or run.created_at is None:
        return ""
    return f"{(run.finished_at - run.created_at).total_seconds():.1f}s"


@runs_app.command("show")
@friendly_errors
def runs_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", show_default=False)],
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a run: its turns and tool calls (not the thread's other runs), usage and child runs.

    `threads-celery events THREAD_ID` replays the whole thread; --json adds the thread's messages.

    \b
      threads-celery runs show run_3f2a...
      threads-celery runs show run_3f2a... --json
    """
    if embedded_db_missing(db) is not None:
        raise RunNotFound(run_id)
    threads = open_threads(db, need_broker=False)
    try:
        found = threads.get_run(run_id)
        usage = threads.usage(run_id=run_id)
        # This run's own part of its thread: the turns, calls and totals of the run asked for.
        history = [event for event in threads.events(found.thread_id) if event.run_id == found.id]
        with threads.store.read() as tx:
            answered = tx.call_timeline(found.id, preview_chars=0)
            marks = tx.version_marks(found.id)
        children = agent_tool_runs_of(threads, found.thread_id) if as_json else []
        messages = threads.messages(found.thread_id) if as_json else []
    finally:
        threads.close()
    if as_json:
        payload = {
            **run_to_json(found),
            "usage": usage.to_json(),
            "messages": [message_to_json(m) for m in messages],
            "agent_tool_runs": [agent_tool_run_to_json(r) for r in children],
            "version_marks": dict(marks),
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    out.print(run_summary(found, usage, marks))
    out.print()
    view = RunView(agent=found.agent)
    view.note_answers(answered)  # who approved, denied or resolved its calls, as a live run says
    view.add_events(history)
    view.update(found)
    out.print(view.render())


def usage_line(usage: UsageTotals) -> str:
    """``3 requests, 1,200 in + 340 out tokens, cost 0.0021`` (no cost when nothing was priced)."""
    line = f"{usage.requests} requests, {usage.input_tokens:,} in + {usage.output_tokens:,} out tokens"
    return line if usage.cost is None else f"{line}, cost {usage.cost:.6g}"


def _taken_by(run_id: str, marks: Sequence[tuple[str, str]]) -> str:
    """``step 0 v1, call 0:0 v1, step 1 v2``: the version that took each step and call."""
    step_prefix, call_prefix = f"step:{run_id}:", f"{run_id}:"
    return ", ".join(
        f"step {key.removeprefix(step_prefix)} {version}"
        if key.startswith(step_prefix)
        else f"call {key.removeprefix(call_prefix)} {version}"
        for key, version in marks
    )


def run_summary(run: Run, usage: UsageTotals | None = None, marks: Sequence[tuple[str, str]] = ()) -> RenderableType:
    """A run's fields as a two-column table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run", run.id)
    table.add_row("thread", run.thread_id)
    table.add_row("agent", run.agent)
    table.add_row("status", Text(run.status, style=STATUS_STYLES.get(run.status, "")))
    table.add_row("step", str(run.step))
    if run.deploy_version is not None:
        table.add_row("version", f"{run.deploy_version} ({run.deploy_policy or 'pinned'})")
    if marks:  # which version took each step and call, in order
        table.add_row("taken by", _taken_by(run.id, marks))
    if run.deploy_pin_reason:
        table.add_row("pinned", Text(f"checked against {run.deploy_checked}: {run.deploy_pin_reason}", style="yellow"))
    for name in ("created_at", "started_at", "finished_at"):
        value = getattr(run, name)
        if value is not None:
            table.add_row(name.replace("_at", ""), value.isoformat(timespec="milliseconds"))
    if usage is not None:
        table.add_row("usage", usage_line(usage))
    if run.output:
        table.add_row("output", escape(shorten(run.output, 400)))
    if run.error:
        table.add_row("error", Text(run.error, style="red"))
    return table


@runs_app.command("cancel")
@friendly_errors
def runs_cancel(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", show_default=False)],
    db: EmbeddedDb = None,
) -> None:
    """Abort a run that has not ended (one that has is left as it is).

    \b
      threads-celery runs cancel run_3f2a...
    """
    if embedded_db_missing(db) is not None:
        raise RunNotFound(run_id)
    threads = open_threads(db)
    try:
        before = threads.get_run(run_id)
        after = threads.cancel(run_id, reason="cancelled from the command line")
    finally:
        threads.close()
    if before.is_terminal:
        out.print(f"run {run_id} had already ended: {before.status}")
    else:
        out.print(
            Text.assemble(f"run {run_id}: {before.status} → ", (after.status, STATUS_STYLES.get(after.status, "")))
        )


# -- events ------------------------------------------------------------------------------------


def event_to_json(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "type": event.type,
        "run_id": event.run_id,
        "payload": jsonable(event.payload),
        "created_at": event.created_at.isoformat() if event.created_at else None,
    }


@friendly_errors
def events(
    thread_id: Annotated[str, typer.Argument(metavar="THREAD_ID", show_default=False)],
    after: Annotated[
        int, typer.Option("--after", min=0, help="Only events after this sequence number (resume where you stopped).")
    ] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="After the replay, keep tailing the log (Ctrl-C stops).")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0.0, help="With --follow: stop tailing after this many seconds (exit 0)."),
    ] = None,
    db: EmbeddedDb = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per line (seq, type, run_id, payload, created_at).")
    ] = False,
) -> None:
    """Replay a thread's events; with --follow, keep tailing them live.

    The live view shows each turn and tool call, runs starting and ending, and a progress bar,
    phase and milestones for every child agent-tool run. Events are numbered per thread: pass
    the last number seen to --after to pick up where you left off.

    \b
      threads-celery events thread_9c1e...
      threads-celery events thread_9c1e... --follow
      threads-celery events thread_9c1e... --after 42 --json
    """
    if embedded_db_missing(db) is not None:
        raise ThreadNotFound(thread_id)
    threads = open_threads(db, need_broker=False)
    try:
        if not threads.runs(thread_id=thread_id, limit=1):
            raise ThreadNotFound(thread_id)
        if as_json:
            try:
                for event in threads.events(thread_id, after=after, follow=follow, timeout=timeout):
                    sys.stdout.write(json.dumps(event_to_json(event)) + "\n")
                    sys.stdout.flush()
            except KeyboardInterrupt:
                pass
            return
        view = RunView(thread_id=thread_id)
        view.last_event_seq = after
        with threads.store.read() as tx:  # who approved, denied or resolved the thread's calls
            for run in threads.runs(thread_id=thread_id, limit=REPLAYED_RUNS):
                view.note_answers(tx.call_timeline(run.id, preview_chars=0))
        out.print(view.render_header())
        with contextlib.suppress(KeyboardInterrupt):
            follow_thread(threads, thread_id, console=out, view=view, follow=follow, timeout=timeout)
        out.print(view.render_live())
        if not follow:
            out.print(Text(f"last event: {view.last_event_seq}", style="dim"))
    finally:
        threads.close()


@runs_app.command("allow-usage")
@friendly_errors
def runs_allow_usage(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", show_default=False)],
    principal: Annotated[str, typer.Option("--principal", metavar="NAME", help="Who allows it.", show_default=False)],
    db: EmbeddedDb = None,
) -> None:
    """Let a run parked at a usage limit (on_limit="ask") go on; its usage counts again from now.

    \b
      threads-celery runs allow-usage run_3f2a... --principal alice
    """
    threads = open_threads(db)
    try:
        run = threads.allow_usage(run_id, principal=principal)
    finally:
        threads.close()
    out.print(f"✓ {run.id} goes on ({run.status}), allowed by {principal}")


@friendly_errors
def usage_command(
    run: Annotated[str | None, typer.Option("--run", help="One run's usage.")] = None,
    thread: Annotated[str | None, typer.Option("--thread", help="One thread's usage (all its runs).")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="One agent's usage.")] = None,
    day: Annotated[
        str | None, typer.Option("--day", help="A UTC day, YYYY-MM-DD, or 'today'.", show_default=False)
    ] = None,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """Model usage: requests, input and output tokens, and cost (with THREADS_MODEL_PRICES).

    Filters combine; with none, everything in the ledger.

    \b
      threads-celery usage --run run_3f2a...
      threads-celery usage --agent trip-planner --day today --json
    """
    from datetime import UTC, date, datetime

    from threads_celery.decisions.usage import named_day

    on_day: date | None = None
    if day is not None:
        try:
            on_day = named_day(day, now=datetime.now(UTC))
        except ValueError:
            raise UsageError(f"--day must be YYYY-MM-DD or 'today', not {day!r}") from None
    threads = open_threads(db, need_broker=False)
    try:
        if run is not None:
            threads.get_run(run)
        totals = threads.usage(run_id=run, thread_id=thread, agent=agent, day=on_day)
    finally:
        threads.close()
    if as_json:
        sys.stdout.write(json.dumps(totals.to_json()) + "\n")
    else:
        out.print(usage_line(totals))
