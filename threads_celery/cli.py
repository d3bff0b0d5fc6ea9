"""The ``threads-celery`` command line.

With no ``THREADS_DATABASE_URL`` and no ``THREADS_BROKER_URL``, ``threads-celery run`` uses the
embedded default (SQLite in ``.threads-celery/embedded.db`` and an in-process Celery worker), so
an agent runs with nothing else installed. With both set, it enqueues to the broker and watches
the ledger while ``threads-celery worker`` processes do the work.

Exit codes: 0 the run completed (or the command succeeded); 1 the run ended in error, was aborted
or interrupted; 2 a usage or configuration error (never a traceback); 3 the run waits for a person
(parked, awaiting approval or a variable); 4 the run did not end within ``--timeout``.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.prompt import Prompt
from rich.table import Table
from rich.text import Text

from .exceptions import ConfigError, RunNotFound, StoreUnavailable, ThreadsError
from .live import NEEDS_A_PERSON, STATUS_STYLES, RunView, follow_run, format_args, run_summary
from .records import ACTIVE_STATUSES, TERMINAL_STATUSES, Message, Run

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from .agents import Agent
    from .client import Threads
    from .settings import Settings

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_NEEDS_A_PERSON = 3
EXIT_TIMEOUT = 4

ALL_STATUSES = sorted(ACTIVE_STATUSES | TERMINAL_STATUSES)
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
        "  threads-celery runs list\n\n"
        "In production, point every process at PostgreSQL and a broker:\n\n"
        "\b\n"
        "  export THREADS_DATABASE_URL=postgresql://app@db/threads\n"
        "  export THREADS_BROKER_URL=redis://redis:6379/0\n"
        "  threads-celery db upgrade\n"
        "  threads-celery worker --agents myapp.agents\n"
        "  threads-celery beat\n\n"
        "Exit codes of `run`: 0 completed, 1 error/aborted/interrupted, 2 usage or configuration "
        "error, 3 waits for a person, 4 timed out."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
runs_app = typer.Typer(
    help="List, inspect and cancel runs.\n\n\b\n  threads-celery runs list --status running\n  threads-celery runs show run_3f2a...",
    no_args_is_help=True,
)
db_app = typer.Typer(
    help="Database migrations.\n\n\b\n  threads-celery db upgrade --database-url postgresql://app@db/threads\n  threads-celery db current",
    no_args_is_help=True,
)
app.add_typer(runs_app, name="runs")
app.add_typer(db_app, name="db")

F = TypeVar("F", bound=Callable[..., Any])


class Pool(str, Enum):
    prefork = "prefork"
    threads = "threads"
    solo = "solo"


class UsageError(ThreadsError):
    """The command was used wrongly."""


def friendly_errors(command: F) -> F:
    """Turn the library's errors into one red line and exit code 2 (never a traceback)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ThreadsError as exc:
            fail(exc.message or type(exc).__name__)

    return wrapper  # type: ignore[return-value]


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err.print(Text.assemble(("error: ", "bold red"), (message, "red")), soft_wrap=True)
    raise typer.Exit(code)


@app.callback()
def main() -> None:
    # Like `python -m`, make modules in the current directory importable (agents, tools).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


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
        raise UsageError(f"agent spec {spec!r}: {str(path)!r} is not importable as a module (rename it to a valid identifier)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return ".".join(parts) + (sep + attribute if sep else "")


def load_agent(spec: str) -> Agent:
    """The single agent that ``spec`` names (``module:attr``, ``path.py:attr`` or a module with one agent)."""
    from .agents import import_agents

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


def _settings() -> Settings:
    from .settings import Settings

    return Settings.from_env()


def open_threads(db: Path | None, *, need_broker: bool = True) -> Threads:
    """The runtime handle: embedded at ``db`` (or the default path) unless THREADS_* URLs are set.

    Read-only commands pass ``need_broker=False``: they only read the ledger.
    """
    from .client import Threads
    from .worker import EMBEDDED_BROKER

    settings = _settings()
    if settings.database_url or settings.broker_url:
        if db is not None:
            raise UsageError(
                "--db is for the embedded SQLite database, but THREADS_DATABASE_URL/THREADS_BROKER_URL are set"
            )
        if not need_broker and settings.database_url and not settings.broker_url:
            return Threads(settings=settings, database_url=settings.database_url, broker_url=EMBEDDED_BROKER)
        return Threads(settings=settings)
    return Threads(settings=settings, embedded_path=db or DEFAULT_EMBEDDED_DB)


def _embedded_db_missing(db: Path | None) -> Path | None:
    """The embedded database path when it is the one in use and does not exist yet."""
    settings = _settings()
    if settings.database_url or settings.broker_url:
        return None
    path = db or DEFAULT_EMBEDDED_DB
    return None if path.exists() else path


def require_services(*, database: bool = True, broker: bool = True) -> Settings:
    """The settings, or a ConfigError naming the service URLs that are not set."""
    settings = _settings()
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
    message: Annotated[str, typer.Argument(metavar="MESSAGE", help="The user message ('-' reads it from stdin).", show_default=False)],
    thread: Annotated[
        str | None, typer.Option("--thread", help="Continue this thread (or start one with this id).")
    ] = None,
    db: Annotated[
        Path | None,
        typer.Option("--db", help="Embedded SQLite file [default: .threads-celery/embedded.db].", dir_okay=False),
    ] = None,
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

    \b
      threads-celery run examples/demo.py:agent "plan a dinner in Lisbon"
      threads-celery run examples/demo.py:agent "plan a dinner in Rome" --approve --json
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
        try:
            final = _watch(threads, agent, handle.run_id, handle.thread_id, view, timeout=timeout, approve=approve, as_json=as_json)
        except KeyboardInterrupt:
            final = _abandon(threads, threads.get_run(handle.run_id), None, quiet=as_json)
            timed_out = False
        else:
            timed_out = exit_code_for(final.status) == EXIT_TIMEOUT
            if timed_out:
                final = _abandon(threads, final, timeout, quiet=as_json)
        if as_json:
            messages = [m for m in threads.messages(handle.thread_id) if m.run_id == handle.run_id]
            payload = {
                "run_id": final.id,
                "thread_id": final.thread_id,
                "agent": final.agent,
                "status": final.status,
                "output": final.output,
                "error": final.error,
                "timed_out": timed_out,
                "messages": [message_to_json(m) for m in messages],
            }
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        else:
            view.add_all(threads.messages(handle.thread_id, after=view.last_seq))
            view.update(final)
            out.print(view.render_live())
            if final.status in NEEDS_A_PERSON:
                hint = " (re-run with --approve to approve its calls)" if final.status == "awaiting_approval" else ""
                err.print(
                    f"run {final.id} is {final.status.replace('_', ' ')}; it resumes once a person decides{hint}.",
                    style="yellow",
                    soft_wrap=True,
                )
        raise typer.Exit(EXIT_TIMEOUT if timed_out else exit_code_for(final.status))
    finally:
        threads.close()


def _watch(
    threads: Threads,
    agent: Agent,
    run_id: str,
    thread_id: str,
    view: RunView,
    *,
    timeout: float,
    approve: bool,
    as_json: bool,
) -> Run:
    """Follow the run until it ends, needs a person nobody here can be, or time runs out."""
    deadline = time.monotonic() + timeout
    interactive = not as_json and not approve and sys.stdin.isatty() and out.is_terminal
    header = True
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        if as_json:
            run = _wait_quietly(threads, run_id, remaining)
        else:
            run = follow_run(threads, run_id, thread_id, console=out, view=view, timeout=remaining, header=header)
        header = False
        if run.status != "awaiting_approval" or not (approve or interactive):
            return run
        if not _decide_approvals(threads, agent, run, auto=approve, view=view):
            return run


def _principal() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "cli"


def _decide_approvals(threads: Threads, agent: Agent, run: Run, *, auto: bool, view: RunView) -> bool:
    """Approve (or ask about) the calls ``run`` waits on. False means: stop watching."""
    pending = [c for c in threads.parked() if c.run_id == run.id and c.status == "awaiting_approval"]
    if not pending:
        return True  # decided meanwhile (by someone else): keep watching
    principal = _principal()
    for call in pending:
        if not auto:
            tool = agent.tool_named(call.tool)
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
        view.note_call(call.effect_key, f"✓ approved by {principal}" + (" (--approve)" if auto else ""))
    return True


def _wait_quietly(threads: Threads, run_id: str, timeout: float) -> Run:
    from .exceptions import RunTimeout

    try:
        return threads.wait(run_id, timeout)
    except RunTimeout:
        return threads.get_run(run_id)


def _abandon(threads: Threads, run: Run, timeout: float | None, *, quiet: bool) -> Run:
    """Stop watching a run that has not ended.

    Embedded, this process is the only worker, so the run is cancelled rather than left
    'running' with nobody to drive it. With a broker, the workers carry on.
    """
    why = f"did not end within {timeout:g}s" if timeout is not None else "was interrupted (Ctrl-C)"
    if threads.is_embedded and run.status not in TERMINAL_STATUSES and run.status not in NEEDS_A_PERSON:
        reason = f"threads-celery run {why}"
        run = threads.cancel(run.id, reason=reason)
        if not quiet:
            err.print(
                f"run {run.id} {why}; the in-process worker stops with this command, so it was cancelled.",
                style="yellow",
                soft_wrap=True,
            )
    elif not quiet:
        err.print(
            f"run {run.id} {why} (status: {run.status}); the workers carry on. "
            f"Watch it with: threads-celery runs show {run.id}",
            style="yellow",
            soft_wrap=True,
        )
    return run


# -- worker and beat ---------------------------------------------------------------------------


@app.command()
@friendly_errors
def worker(
    agents: Annotated[
        str | None,
        typer.Option(
            "--agents",
            help="Comma-separated agent specs to load (module, module:attr or file.py:attr); sets THREADS_AGENTS.",
        ),
    ] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", min=1, help="Worker processes/threads [default: CPU count].")] = None,
    pool: Annotated[Pool, typer.Option("--pool", "-P", help="Celery execution pool.")] = Pool.prefork,
    queues: Annotated[
        str | None,
        typer.Option("--queues", "-Q", help="Comma-separated queues to consume [default: threads]. Include 'threads' unless another worker serves it."),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
) -> None:
    """Run a Celery worker that executes model steps and tool calls.

    Needs THREADS_DATABASE_URL and THREADS_BROKER_URL.

    \b
      threads-celery worker --agents myapp.agents --concurrency 4
      threads-celery worker --agents examples/demo.py:agent --pool threads -Q threads,email
    """
    require_services()
    if agents:
        os.environ["THREADS_AGENTS"] = ",".join(resolve_spec(s) for s in agents.split(",") if s.strip())
    else:
        specs = [s for s in os.environ.get("THREADS_AGENTS", "").split(",") if s.strip()]
        if not specs:
            raise ConfigError("no agents to run: pass --agents myapp.agents or set THREADS_AGENTS")
        os.environ["THREADS_AGENTS"] = ",".join(resolve_spec(s) for s in specs)
    from .worker import app_from_environment

    celery_app = app_from_environment()
    _preflight(celery_app)
    argv = ["worker", f"--loglevel={loglevel.upper()}", f"--pool={pool.value}"]
    if concurrency is not None:
        argv.append(f"--concurrency={concurrency}")
    if queues:
        argv.append(f"--queues={queues}")
    celery_app.worker_main(argv)


def _preflight(celery_app: Any) -> None:
    """Fail now, with a clear message, if the agents do not load or the ledger is not ready."""
    from .store.engine import safe_url
    from .store.migrate import current_revision, head_revision

    runtime = celery_app.threads_runtime.get()
    runtime.store.ping()
    current = current_revision(runtime.store.engine)
    if current != head_revision():
        raise ConfigError(
            f"the database at {safe_url(runtime.store.engine.url)} is at migration {current or 'none'}, "
            f"not {head_revision()}: run `threads-celery db upgrade`"
        )
    names = ", ".join(a.name for a in runtime.registry) or "none"
    err.print(f"agents: {names}", style="dim")


@app.command()
@friendly_errors
def beat(
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
    schedule: Annotated[
        Path | None,
        typer.Option("--schedule", "-s", help="Beat's schedule state file [default: a file under the temp dir].", dir_okay=False),
    ] = None,
) -> None:
    """Run Celery beat: the reconcile tick every THREADS_RECONCILE_INTERVAL_S seconds (default 5).

    Run exactly one beat per deployment (a second one is safe, just wasteful).

    \b
      threads-celery beat
      threads-celery beat --schedule /var/lib/threads/beat-schedule
    """
    require_services(database=False)
    from .worker import app_from_environment

    celery_app = app_from_environment()
    if schedule is None:
        user = getattr(os, "getuid", lambda: "user")()
        schedule = Path(tempfile.gettempdir()) / f"threads-celery-{user}" / "beat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    celery_app.start(["beat", f"--loglevel={loglevel.upper()}", f"--schedule={schedule}"])


# -- db ----------------------------------------------------------------------------------------


@contextmanager
def _engine(database_url: str | None) -> Iterator[Engine]:
    from sqlalchemy.exc import OperationalError

    from .store.engine import safe_url
    from .worker import open_store

    url = database_url or _settings().database_url or f"sqlite:///{DEFAULT_EMBEDDED_DB}"
    store = open_store(url)
    try:
        yield store.engine
    except OperationalError as exc:  # what a migration or a revision check meets when the server is away
        first = (str(exc.orig).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreUnavailable(f"cannot reach the database at {safe_url(store.engine.url)}: {first}") from exc
    finally:
        store.dispose()


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Database URL [default: THREADS_DATABASE_URL, else the embedded .threads-celery/embedded.db].",
        show_default=False,
    ),
]


@db_app.command("upgrade")
@friendly_errors
def db_upgrade(database_url: DatabaseUrl = None) -> None:
    """Apply every pending migration.

    \b
      threads-celery db upgrade
      threads-celery db upgrade --database-url postgresql://app@localhost/threads
    """
    from .store.engine import safe_url
    from .store.migrate import current_revision, head_revision, upgrade

    with _engine(database_url) as engine:
        before = current_revision(engine)
        upgrade(engine)
        after = current_revision(engine)
        where = safe_url(engine.url)
    if before == after:
        out.print(f"{where}: already at {after} (head)", soft_wrap=True)
    else:
        out.print(
            f"{where}: upgraded {before or '(empty)'} → {after}" + (" (head)" if after == head_revision() else ""),
            soft_wrap=True,
        )


@db_app.command("current")
@friendly_errors
def db_current(database_url: DatabaseUrl = None) -> None:
    """Print the database's migration revision.

    \b
      threads-celery db current
    """
    from .store.engine import safe_url
    from .store.migrate import current_revision, head_revision

    if database_url is None and not _settings().database_url and not DEFAULT_EMBEDDED_DB.exists():
        raise UsageError(f"no embedded database at {DEFAULT_EMBEDDED_DB} (set THREADS_DATABASE_URL or --database-url)")
    with _engine(database_url) as engine:
        current = current_revision(engine)
        where = safe_url(engine.url)
    head = head_revision()
    if current == head:
        out.print(f"{current} (head)")
    else:
        out.print(f"{current or '(empty)'} (head is {head}: run `threads-celery db upgrade`)", soft_wrap=True)
    err.print(where, style="dim", soft_wrap=True)


# -- runs --------------------------------------------------------------------------------------

EmbeddedDb = Annotated[
    Path | None,
    typer.Option("--db", help="Embedded SQLite file [default: .threads-celery/embedded.db].", dir_okay=False),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@runs_app.command("list")
@friendly_errors
def runs_list(
    thread: Annotated[str | None, typer.Option("--thread", help="Only runs of this thread.")] = None,
    status: Annotated[str | None, typer.Option("--status", help=f"Only runs in this status ({', '.join(ALL_STATUSES)}).")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many, newest first.")] = 20,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """List recent runs, newest first.

    \b
      threads-celery runs list
      threads-celery runs list --status parked --json
    """
    if status is not None and status not in ALL_STATUSES:
        raise UsageError(f"unknown status {status!r}; one of: {', '.join(ALL_STATUSES)}")
    if _embedded_db_missing(db) is not None:
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
    wide = out.width >= 110  # a narrow terminal drops the creation time rather than squeeze the ids
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run", no_wrap=True, min_width=max(len(r.id) for r in found))
    table.add_column("status", no_wrap=True, min_width=max(len(r.status) for r in found))
    table.add_column("agent", no_wrap=True, min_width=min(16, max(len(r.agent) for r in found)))
    if wide:
        table.add_column("created", no_wrap=True, min_width=14)
    table.add_column("took", no_wrap=True, justify="right", min_width=5)
    table.add_column("input", overflow="ellipsis", no_wrap=True, ratio=1)
    for r in found:
        took = f"{(r.finished_at - r.created_at).total_seconds():.1f}s" if r.finished_at and r.created_at else ""
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


@runs_app.command("show")
@friendly_errors
def runs_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", show_default=False)],
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a run and its thread's messages.

    \b
      threads-celery runs show run_3f2a...
    """
    if _embedded_db_missing(db) is not None:
        raise RunNotFound(run_id)
    threads = open_threads(db, need_broker=False)
    try:
        found = threads.get_run(run_id)
        messages = threads.messages(found.thread_id)
    finally:
        threads.close()
    if as_json:
        sys.stdout.write(
            json.dumps({**run_to_json(found), "messages": [message_to_json(m) for m in messages]}, indent=2) + "\n"
        )
        return
    out.print(run_summary(found))
    out.print()
    view = RunView(agent=found.agent)
    view.add_all(messages)
    view.update(found)
    out.print(view.render())


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
    if _embedded_db_missing(db) is not None:
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
        out.print(Text.assemble(f"run {run_id}: {before.status} → ", (after.status, STATUS_STYLES.get(after.status, ""))))


# -- JSON --------------------------------------------------------------------------------------


def run_to_json(run: Run) -> dict[str, Any]:
    data = asdict(run)
    for key, value in data.items():
        if hasattr(value, "isoformat"):
            data[key] = value.isoformat()
    return data


def message_to_json(message: Message) -> dict[str, Any]:
    return {
        "seq": message.seq,
        "role": message.role,
        "text": message.text,
        "run_id": message.run_id,
        "tool_calls": [c.to_json() for c in message.tool_calls],
        "tool_result": message.tool_result.to_json() if message.tool_result else None,
        "created_at": message.created_at.isoformat() if message.created_at else None,
    }


# -- api ---------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def api(
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0 in a container).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8000,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="debug, info, warning, error.")] = "info",
) -> None:
    """Serve the HTTP API (start runs, read them, stream events, approve, deny, resolve).

    Routes under /v1 need `Authorization: Bearer <token>` with a token from THREADS_API_TOKENS
    (comma-separated); set THREADS_API_AUTH=off only behind something that authenticates.
    THREADS_AGENTS names the agents whose tool schemas approvals with edited arguments are checked
    against. OpenAPI at /openapi.json; /healthz and /readyz are open.

    \b
      THREADS_API_TOKENS=change-me threads-celery api
      threads-celery api --host 0.0.0.0 --port 8000
    """
    import uvicorn

    from .api import app_from_environment

    api_app = app_from_environment()  # here, not in uvicorn: a bad configuration is one red line
    uvicorn.run(api_app, host=host, port=port, log_level=loglevel.lower(), proxy_headers=True)


if __name__ == "__main__":
    app()
