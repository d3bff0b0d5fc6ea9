"""The ``threads-celery`` command line: the Typer app, what its commands share, and ``run``.

The other commands live beside this module, one noun each: :mod:`~threads_celery.cli.runs`
(``runs list/show/cancel``, ``events``), :mod:`~threads_celery.cli.people` (``parked``,
``approve``, ``deny``, ``resolve``) and :mod:`~threads_celery.cli.service` (``worker``, ``beat``,
``api``, ``db``). They register on :data:`app` when imported, at the end of this module.

With no ``THREADS_DATABASE_URL`` and no ``THREADS_BROKER_URL``, ``threads-celery run`` uses the
embedded default (SQLite in ``.threads-celery/embedded.db`` and an in-process Celery worker), so
an agent runs with nothing else installed. With both set, it enqueues to the broker and watches
the ledger while ``threads-celery worker`` processes do the work.

Exit codes, for every command: 0 done (the run completed); 1 the run ended in error, was aborted
or interrupted; 2 a usage or configuration error, or something named that does not exist (never
a traceback); 3 the run waits for a person (parked, awaiting approval or a variable); 4 the run
(or the background child runs it started) did not end within ``--timeout``.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.prompt import Prompt
from rich.text import Text

from threads_celery.cli.live import NEEDS_A_PERSON, RunView, format_args, is_narration
from threads_celery.cli.watch import follow_run
from threads_celery.exceptions import ConfigError, ThreadsError
from threads_celery.records import TERMINAL_STATUSES, Message, Run

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.definitions.agents import Agent
    from threads_celery.records import AgentToolRun
    from threads_celery.settings import Settings

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_NEEDS_A_PERSON = 3
EXIT_TIMEOUT = 4

DEFAULT_EMBEDDED_DB = Path(".threads-celery") / "embedded.db"

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

app = typer.Typer(
    name="threads-celery",
    help=(
        "Durable agents on Celery: every model turn and tool call is a task, every result is "
        "committed to a ledger.\n\n"
        "Without THREADS_DATABASE_URL / THREADS_BROKER_URL everything runs embedded (SQLite in "
        ".threads-celery/ and an in-process worker):\n\n"
        "\b\n"
        '  threads-celery run examples/demo.py:agent "plan a dinner in Lisbon"\n'
        '  threads-celery run examples/research.py:agent "Compare HTTP/3 and gRPC" --approve\n'
        "  threads-celery runs list\n"
        "  threads-celery events THREAD_ID --follow\n"
        "  threads-celery parked\n\n"
        "In production, point every process at PostgreSQL and a broker:\n\n"
        "\b\n"
        "  export THREADS_DATABASE_URL=postgresql://app@db/threads\n"
        "  export THREADS_BROKER_URL=redis://redis:6379/0\n"
        "  threads-celery db upgrade\n"
        "  threads-celery worker --agents myapp.agents\n"
        "  threads-celery beat\n"
        "  threads-celery approve run_3f2a...:1:0 --principal alice\n\n"
        "Exit codes: 0 ok / completed, 1 the run failed (error, aborted, interrupted), 2 usage, "
        "configuration or not found, 3 waits for a person, 4 timed out."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

P = ParamSpec("P")
R = TypeVar("R")


class UsageError(ThreadsError):
    """The command was used wrongly."""


def friendly_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn the library's errors into one red line and exit code 2 (never a traceback)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except ThreadsError as exc:
            fail(exc.message or type(exc).__name__)

    return wrapper


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err.print(Text.assemble(("error: ", "bold red"), (message, "red")), soft_wrap=True)
    raise typer.Exit(code)


@app.callback()
def main() -> None:
    # Like `python -m`, make modules in the current directory importable (agents, tools).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


# -- options shared by several commands --------------------------------------------------------

EmbeddedDb = Annotated[
    Path | None,
    typer.Option("--db", help="Embedded SQLite file [default: .threads-celery/embedded.db].", dir_okay=False),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


# -- agent specs -------------------------------------------------------------------------------


def resolve_spec(spec: str) -> str:
    """``module:attr`` for a spec whose module part may be a path to a ``.py`` file.

    A file inside a package (directories with ``__init__.py``) is imported by its dotted name
    from the package root, which is put on ``sys.path``; so is a loose file, by its stem. Either
    way the module has a real name that a worker process can import too.
    """
    module_part, sep, attribute = spec.strip().partition(":")
    if not module_part:
        raise UsageError(f"agent spec {spec!r} names no module (expected MODULE:AGENT, e.g. examples/demo.py:agent)")
    if not (module_part.endswith(".py") or os.sep in module_part or "/" in module_part):
        return spec.strip()
    path = Path(module_part).expanduser()
    if path.is_dir():
        path = path / "__init__.py"
    if not path.is_file():
        raise UsageError(f"agent spec {spec!r}: no such file {str(path)!r}")
    path = path.resolve()
    parts = [] if path.name == "__init__.py" else [path.stem]
    root = path.parent
    while (root / "__init__.py").is_file() and root.parent != root:
        parts.insert(0, root.name)
        root = root.parent
    if not parts or not all(p.isidentifier() for p in parts):
        raise UsageError(
            f"agent spec {spec!r}: {str(path)!r} is not importable as a module (rename it to a valid identifier)"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return ".".join(parts) + (sep + attribute if sep else "")


def load_agent(spec: str) -> Agent:
    """The single agent that ``spec`` names (``module:attr``, ``path.py:attr`` or a module with one agent)."""
    from threads_celery.definitions.agents import import_agents

    module_spec = resolve_spec(spec)
    try:
        agents = import_agents(module_spec)
    except ThreadsError:
        raise
    except Exception as exc:  # the user's module failed while importing: say where, briefly
        raise UsageError(f"importing {spec!r} failed: {type(exc).__name__}: {exc}{_where(exc)}") from exc
    if len(agents) > 1:
        names = ", ".join(a.name for a in agents)
        raise UsageError(f"{spec!r} defines several agents ({names}); name one as MODULE:ATTRIBUTE")
    return agents[0]


def _where(exc: BaseException) -> str:
    tb = exc.__traceback__
    frame = None
    while tb is not None:
        frame, tb = tb, tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}:{exc.lineno})"
    if frame is None:
        return ""
    return f" ({frame.tb_frame.f_code.co_filename}:{frame.tb_lineno})"


# -- opening the runtime -----------------------------------------------------------------------


def settings_from_env() -> Settings:
    from threads_celery.settings import Settings

    return Settings.from_env()


def open_threads(db: Path | None, *, need_broker: bool = True) -> Threads:
    """The runtime handle: embedded at ``db`` (or the default path) unless THREADS_* URLs are set.

    Read-only commands pass ``need_broker=False``: they only read the ledger.
    """
    from threads_celery.client.threads import Threads
    from threads_celery.worker.app import EMBEDDED_BROKER

    settings = settings_from_env()
    if settings.database_url or settings.broker_url:
        if db is not None:
            raise UsageError(
                "--db is for the embedded SQLite database, but THREADS_DATABASE_URL/THREADS_BROKER_URL are set"
            )
        if not need_broker and settings.database_url and not settings.broker_url:
            return Threads(settings=settings, database_url=settings.database_url, broker_url=EMBEDDED_BROKER)
        return Threads(settings=settings)
    return Threads(settings=settings, embedded_path=db or DEFAULT_EMBEDDED_DB)


def embedded_db_missing(db: Path | None) -> Path | None:
    """The embedded database path when it is the one in use and does not exist yet."""
    settings = settings_from_env()
    if settings.database_url or settings.broker_url:
        return None
    path = db or DEFAULT_EMBEDDED_DB
    return None if path.exists() else path


def require_services(*, database: bool = True, broker: bool = True) -> Settings:
    """The settings, or a ConfigError naming the service URLs that are not set."""
    settings = settings_from_env()
    missing = [
        name
        for name, wanted, value in (
            ("THREADS_DATABASE_URL", database, settings.database_url),
            ("THREADS_BROKER_URL", broker, settings.broker_url),
        )
        if wanted and not value
    ]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; this command talks to real "
            "services (e.g. THREADS_DATABASE_URL=postgresql://user@localhost/threads "
            "THREADS_BROKER_URL=redis://localhost:6379/0)"
        )
    return settings


def principal_of_this_user() -> str:
    """``cli:<login name>``: who a decision made at this terminal is recorded as."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "cli"


# -- run ---------------------------------------------------------------------------------------


def exit_code_for(status: str) -> int:
    """The process exit code for a run that stopped being watched in ``status``."""
    if status == "completed":
        return EXIT_OK
    if status in TERMINAL_STATUSES:
        return EXIT_RUN_FAILED
    if status in NEEDS_A_PERSON:
        return EXIT_NEEDS_A_PERSON
    return EXIT_TIMEOUT


@app.command()
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
    agent = load_agent(agent_spec)
    threads = open_threads(db)
    try:
        handle = threads.start(agent, message, thread_id=thread)
        view = RunView(run_id=handle.run_id, agent=agent.name)
        code = watch_to_end(
            threads, agent, handle.run_id, handle.thread_id, view, timeout=timeout, approve=approve, as_json=as_json
        )
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
) -> int:
    """Watch a run until it stops, print where it stopped (or its JSON), and return the exit code."""
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
            hint = " (re-run with --approve to approve its calls)" if final.status == "awaiting_approval" else ""
            err.print(
                f"run {final.id} is {final.status.replace('_', ' ')}; it resumes once a person decides{hint}. "
                "See `threads-celery parked`.",
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


# -- JSON --------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Dataclass fields as JSON values: datetimes as ISO 8601, tuples as lists."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    return value


def run_to_json(run: Run) -> dict[str, Any]:
    data: dict[str, Any] = jsonable(asdict(run))
    return data


def message_to_json(message: Message) -> dict[str, Any]:
    return {
        "seq": message.seq,
        "role": message.role,
        "text": message.text,
        "run_id": message.run_id,
        "tool_calls": [c.to_json() for c in message.tool_calls],
        "tool_result": message.tool_result.to_json() if message.tool_result else None,
        "meta": message.meta,
        "created_at": message.created_at.isoformat() if message.created_at else None,
    }


def agent_tool_runs_of(threads: Threads, thread_id: str, *, run_id: str | None = None) -> list[AgentToolRun]:
    """The thread's child runs (those ``run_id`` started, if given), each with its milestones."""
    rows = [r for r in threads.agent_tool_runs(thread_id) if run_id is None or r.parent_run_id == run_id]
    return [threads.inspect_agent_tool_run(r.run_id) or r for r in rows]


def agent_tool_run_to_json(row: AgentToolRun) -> dict[str, Any]:
    names = (
        "run_id", "agent_type", "display_name", "status", "reason", "error", "child_still_running", "summary",
        "output", "progress", "detached", "parent_run_id", "child_run_id", "child_thread_id", "delivered",
        "created_at", "finished_at",
    )  # fmt: skip
    data: dict[str, Any] = {name: jsonable(getattr(row, name)) for name in names}
    data["milestones"] = [{"sequence": m.sequence, "name": m.name, "data": jsonable(m.data)} for m in row.milestones]
    return data


# The other commands register themselves on `app` when imported (after everything above exists).
if __name__ != "__main__":
    from threads_celery.cli import people, runs, service  # noqa: F401

if __name__ == "__main__":
    # `python -m threads_celery.cli.app` runs this file as __main__, a second copy of the module; the
    # commands above registered on the app of `threads_celery.cli.app`, which is the one to run.
    from threads_celery.cli.app import app as registered_app

    registered_app()
