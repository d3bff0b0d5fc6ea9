"""``threads-celery run``: start a run and watch it live until it ends.

:func:`watch_to_end` is also how ``approve``, ``deny`` and ``resolve --agent`` continue an
embedded run after a decision: it follows the run (answering approvals with ``--approve`` or at
a terminal), waits for the background child runs an embedded run started, and returns the
command's exit code.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.prompt import Prompt
from rich.text import Text

from threads_celery.cli.common import (
    EXIT_NEEDS_A_PERSON,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_TIMEOUT,
    EmbeddedDb,
    UsageError,
    agent_tool_run_to_json,
    agent_tool_runs_of,
    embedded_db_missing,
    err,
    friendly_errors,
    load_agent,
    message_to_json,
    open_threads,
    out,
    principal_of_this_user,
    run_to_json,
)
from threads_celery.cli.live import NEEDS_A_PERSON, RunView, format_args
from threads_celery.cli.live_entries import is_narration
from threads_celery.cli.watch import follow_run
from threads_celery.definitions.variables import check_secret_key
from threads_celery.exceptions import RunNotFound
from threads_celery.records import TERMINAL_STATUSES, AgentToolRun, Run

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.definitions.agents import Agent


def exit_code_for(status: str) -> int:
    """The process exit code for a run that stopped being watched in ``status``."""
    if status == "completed":
        return EXIT_OK
    if status in TERMINAL_STATUSES:
        return EXIT_RUN_FAILED
    if status in NEEDS_A_PERSON:
        return EXIT_NEEDS_A_PERSON
    return EXIT_TIMEOUT


@friendly_errors
def run(
    agent_spec: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:AGENT",
            help="The agent: a module or .py file, and the attribute holding the Agent (e.g. examples/demo.py:agent, myapp.agents:support).",
            show_default=False,
        ),
    ],
    message: Annotated[
        str, typer.Argument(metavar="MESSAGE", help="The user message ('-' reads it from stdin).", show_default=False)
    ],
    thread: Annotated[
        str | None, typer.Option("--thread", help="Continue this thread (or start one with this id).")
    ] = None,
    db: EmbeddedDb = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the run to end.")] = 300.0,
    approve: Annotated[
        bool,
        typer.Option(
            "--approve",
            "-y",
            help="Approve every tool call this run asks approval for. Without it, a terminal asks you; anything else stops with exit code 3.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the live view.")] = False,
) -> None:
    """Start a run and watch it live until it ends.

    Shows each model turn, each tool call with its result, and every child agent-tool run with
    a progress bar, its phase and its milestones, then the answer. Embedded, the command also waits for background (detached) child runs the run started, since
    its in-process worker stops when it exits. Exit codes: 0 completed, 1 failed, 2 usage,
    3 waits for a person, 4 timed out.

    \b
      threads-celery run examples/demo.py:agent "plan a dinner in Lisbon"
      threads-celery run examples/demo.py:agent "plan a dinner in Rome" --approve --json
      threads-celery run examples/research.py:agent "Compare HTTP/3 and gRPC" --approve
      threads-celery run myapp.agents:support "where is my order?" --thread t-42
      echo "summarise this" | threads-celery run myapp.agents:writer -
    """
    if message == "-":
        message = sys.stdin.read()
    check_secret_key()  # its in-process worker refuses a malformed key as a worker does
    agent = load_agent(agent_spec)
    threads = open_threads(db)
    try:
        handle = threads.start(agent, message, thread_id=thread)
        view = RunView(run_id=handle.run_id, agent=agent.name)
        code = watch_to_end(
            threads, agent, handle.run_id, handle.thread_id, view, timeout=timeout, approve=approve,
            as_json=as_json, agent_spec=agent_spec,
        )  # fmt: skip
    finally:
        threads.close()
    raise typer.Exit(code)


@friendly_errors
def resume(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run to continue.", show_default=False)],
    agent_spec: Annotated[
        str,
        typer.Option(
            "--agent",
            metavar="MODULE:AGENT",
            help="The run's agent (a module or .py file and the attribute holding it), as `run` took it.",
            show_default=False,
        ),
    ],
    db: EmbeddedDb = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the run to end.")] = 300.0,
    approve: Annotated[
        bool, typer.Option("--approve", "-y", help="Approve every tool call the run asks approval for from here on.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the live view.")] = False,
) -> None:
    """Continue a run here and watch it until it ends.

    Embedded, no worker runs between commands: a decision recorded without --agent (`approve`,
    `deny`, `resolve`), or a command that stopped while its run went on, leaves the run's next
    task in the ledger. This runs it in this process, and the rest of the run after it. With
    PostgreSQL and a broker the workers carry runs on, and this only watches. Exit codes as `run`.

    \b
      threads-celery resume run_3f2a... --agent examples/demo.py:agent
      threads-celery resume run_3f2a... --agent myapp.agents:planner --approve
    """
    if embedded_db_missing(db) is not None:
        raise RunNotFound(run_id)
    check_secret_key()  # its in-process worker refuses a malformed key as a worker does
    agent = load_agent(agent_spec)
    threads = open_threads(db)
    try:
        run = threads.get_run(run_id)
        if run.agent != agent.name:
            raise UsageError(f"run {run.id} belongs to agent {run.agent!r}, not to {agent_spec!r} ({agent.name!r})")
        threads.registry.add(agent)
        view = RunView(run_id=run.id, agent=run.agent)
        if threads.is_embedded and not run.is_terminal:
            # What the view holds now was shown when the run stopped; only what comes next is printed.
            threads.start_worker()
            view.add_events(threads.events(run.thread_id))
            view.take_settled()
            threads.pick_up(run.id)
        if not as_json and not run.is_terminal:
            out.print(Text.assemble(("▶ continuing ", "bold magenta"), (run.agent, "bold"), (f"  {run.id}", "dim")))
        code = watch_to_end(
            threads, agent, run.id, run.thread_id, view, timeout=timeout, approve=approve, as_json=as_json,
            header=False, agent_spec=agent_spec,
        )  # fmt: skip
    finally:
        threads.close()
    raise typer.Exit(code)


def watch_to_end(
    threads: Threads,
    agent: Agent,
    run_id: str,
    thread_id: str,
    view: RunView,
    *,
    timeout: float,
    approve: bool,
    as_json: bool,
    header: bool = True,
    agent_spec: str | None = None,
) -> int:
    """Watch a run until it stops, print where it stopped (or its JSON), and return the exit code.

    ``agent_spec`` (how the command was told the agent) goes into the command a stopped run's
    message names, so that it can be pasted as it is."""
    deadline = time.monotonic() + timeout
    try:
        final = _watch(
            threads, agent, run_id, thread_id, view, deadline=deadline, approve=approve, as_json=as_json, header=header
        )
    except KeyboardInterrupt:
        final = _abandon(threads, threads.get_run(run_id), None, quiet=as_json)
        timed_out = False
    else:
        child_asks = final.status == "waiting" and _ChildApprovals(threads).due(final)
        timed_out = not child_asks and (
            exit_code_for(final.status) == EXIT_TIMEOUT
            or bool(final.is_terminal and threads.is_embedded and background_children(threads, final))
        )
        if timed_out:
            final = _abandon(threads, final, timeout, quiet=as_json)
    if as_json:
        messages = [m for m in threads.messages(thread_id) if m.run_id in (run_id, None) or is_narration(m)]
        children = agent_tool_runs_of(threads, thread_id, run_id=run_id)
        payload = {
            "run_id": final.id,
            **{k: v for k, v in run_to_json(final).items() if k in ("thread_id", "agent", "status", "output", "error")},
            "timed_out": timed_out,
            "messages": [message_to_json(m) for m in messages],
            "agent_tool_runs": [agent_tool_run_to_json(r) for r in children],
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        view.add_events(threads.events(thread_id, after=view.last_event_seq))
        view.update(final)
        out.print(view.render_live())
        if final.is_terminal and not threads.is_embedded and background_children(threads, final):
            err.print(
                f"the workers carry on with its background child runs: threads-celery events {thread_id} --follow",
                style="dim",
                soft_wrap=True,
            )
        if final.status in NEEDS_A_PERSON:
            err.print(
                f"run {final.id} is {final.status.replace('_', ' ')}; it resumes once a person decides. "
                + how_to_decide(threads, final, agent_spec),
                style="yellow",
                soft_wrap=True,
            )
        if child_asks:
            err.print(
                f"run {final.id} waits on a child run whose call awaits approval; it resumes once a person "
                f"decides. See `threads-celery parked --run {final.id}`.",
                style="yellow",
                soft_wrap=True,
            )
    if child_asks:
        return EXIT_NEEDS_A_PERSON
    return EXIT_TIMEOUT if timed_out else exit_code_for(final.status)


def how_to_decide(threads: Threads, run: Run, agent_spec: str | None) -> str:
    """The command that answers what ``run`` waits for, to paste as it is.

    Embedded, no worker runs between commands: the command names the agent, so that it
    continues the run in its own process after the decision.
    """
    calls = [c for c in threads.pending(run.id) if c.status == run.status]
    agent = f" --agent {shlex.quote(agent_spec)}" if agent_spec and threads.is_embedded else ""
    if run.status == "awaiting_approval" and calls:
        command = f"threads-celery approve {calls[0].effect_key} --principal {shlex.quote(principal_of_this_user())}"
        more = f" ({len(calls) - 1} more: `threads-celery parked --run {run.id}`)" if len(calls) > 1 else ""
        return (
            f"Re-run with --approve to approve its calls as they come, or approve this one with: {command}{agent}{more}"
        )
    if run.status == "parked" and calls:
        return (
            f"See `threads-celery parked --run {run.id}`, then settle it with: threads-celery resolve "
            f"{calls[0].effect_key} assume_done|assume_not_done --principal {shlex.quote(principal_of_this_user())}{agent}."
        )
    return f"See `threads-celery parked --run {run.id}`."


def background_children(threads: Threads, run: Run) -> list[AgentToolRun]:
    """Detached child runs started by ``run`` that have not ended, or whose end was not delivered."""
    from threads_celery.transitions.agent_tools import is_active

    return [
        row
        for row in threads.agent_tool_runs(run.thread_id)
        if row.parent_run_id == run.id and (is_active(row.status) or (row.detached and row.status not in row.delivered))
    ]


def _watch(
    threads: Threads,
    agent: Agent,
    run_id: str,
    thread_id: str,
    view: RunView,
    *,
    deadline: float,
    approve: bool,
    as_json: bool,
    header: bool = True,
) -> Run:
    """Follow the run until it ends, needs a person nobody here can be, or time runs out.

    Embedded, a run that ended is followed on while background child runs it started go on:
    they run in this process, which is about to stop.
    """
    interactive = not as_json and not approve and sys.stdin.isatty() and out.is_terminal
    answering = approve or interactive
    child_check = _ChildApprovals(threads)

    def keep_watching(run: Run) -> bool:
        return threads.is_embedded and run.is_terminal and bool(background_children(threads, run))

    def child_asks(run: Run) -> bool:
        # Waiting on a child: stop (to answer, or to say who must) once one of its calls awaits approval.
        return run.status == "waiting" and child_check.due(run)

    while True:
        remaining = max(0.0, deadline - time.monotonic())
        if as_json:
            run = _wait_quietly(threads, run_id, remaining, keep_watching, child_asks)
        else:
            run = follow_run(
                threads, run_id, thread_id, console=out, view=view, timeout=remaining, header=header,
                keep_watching=keep_watching, stop_if=child_asks,
            )  # fmt: skip
        header = False
        waits_on_child = run.status == "waiting" and child_check.due(run)
        if (run.status != "awaiting_approval" and not waits_on_child) or not answering:
            return run
        if not _decide_approvals(threads, agent, run, auto=approve, view=view):
            return run


class _ChildApprovals:
    """Whether a run waiting on children has a child call awaiting approval (read at most
    twice a second: the watch loop polls far more often)."""

    def __init__(self, threads: Threads, every_s: float = 0.5) -> None:
        self.threads = threads
        self.every_s = every_s
        self.checked_at = 0.0
        self.answer = False

    def due(self, run: Run) -> bool:
        now = time.monotonic()
        if now - self.checked_at >= self.every_s:
            self.checked_at = now
            self.answer = any(
                c.kind == "child" and c.status == "awaiting_approval" for c in self.threads.pending(run.id)
            )
        return self.answer


def _decide_approvals(threads: Threads, agent: Agent, run: Run, *, auto: bool, view: RunView) -> bool:
    """Approve (or ask about) the calls ``run`` waits on, its child runs' included. False means:
    stop watching."""
    pending = [c for c in threads.pending(run.id) if c.status == "awaiting_approval"]
    if not pending:
        return True  # decided meanwhile (by someone else): keep watching
    principal = principal_of_this_user()
    for call in pending:
        if not auto:
            owner = threads.registry.get(call.agent) if call.agent and call.agent in threads.registry else agent
            tool = owner.tool_named(call.tool)
            err.print(
                Text.assemble(
                    ("approval needed: ", "bold yellow"),
                    (call.tool, "bold yellow"),
                    ("(", "dim"),
                    format_args(call.args),
                    (")", "dim"),
                    (f"  effect: {tool.effect}" if tool else "", "dim"),
                )
            )
            answer = Prompt.ask("approve?", choices=["y", "n", "q"], default="y", console=err)
            if answer == "q":
                return False
            if answer == "n":
                threads.deny(call.effect_key, "declined at the command line", principal=principal)
                view.note_call(call.effect_key, f"✗ declined by {principal}", style="red")
                continue
        threads.approve(call.effect_key, principal=principal)
        note = f"✓ approved by {principal}" + (" (--approve)" if auto else "")
        if call.kind == "child":
            # The child's calls are not in this run's view: say it on a line of its own.
            err.print(f"{note}: {call.tool} in child run of {call.agent}", style="green")
        else:
            view.note_call(call.effect_key, note)
    return True


def _wait_quietly(
    threads: Threads, run_id: str, timeout: float, keep_watching: Callable[[Run], bool], stop_if: Callable[[Run], bool]
) -> Run:
    deadline = time.monotonic() + timeout
    run = threads.get_run(run_id)
    while not (run.is_terminal or run.status in NEEDS_A_PERSON or stop_if(run)) and time.monotonic() < deadline:
        time.sleep(0.02)
        run = threads.get_run(run_id)
    while keep_watching(run) and time.monotonic() < deadline:
        time.sleep(0.05)
        run = threads.get_run(run_id)
    return run


def _abandon(threads: Threads, run: Run, timeout: float | None, *, quiet: bool) -> Run:
    """Stop watching a run (or the background child runs it started) that has not ended.

    Embedded, this process is the only worker, so what is left is cancelled rather than left
    'running' with nobody to drive it. With a broker, the workers carry on.
    """
    why = f"did not end within {timeout:g}s" if timeout is not None else "was interrupted (Ctrl-C)"
    if threads.is_embedded:
        cancelled = []
        if not run.is_terminal and run.status not in NEEDS_A_PERSON:
            run = threads.cancel(run.id, reason=f"threads-celery run {why}")
            cancelled.append("it")
        left = background_children(threads, run) if run.is_terminal else []
        for row in left:
            threads.cancel_agent_tool(row.run_id, reason=f"threads-celery run {why}")
        if left:
            cancelled.append("the background child runs it started")
        what = f"{' and '.join(cancelled)} {'was' if cancelled == ['it'] else 'were'}"
        if cancelled and not quiet:
            err.print(
                f"run {run.id} {why}; the in-process worker stops with this command, so {what} cancelled.",
                style="yellow",
                soft_wrap=True,
            )
    elif not quiet:
        err.print(
            f"run {run.id} {why} (status: {run.status}); the workers carry on. "
            f"Watch it with: threads-celery events {run.thread_id} --follow",
            style="yellow",
            soft_wrap=True,
        )
    return run
