"""What the ``threads-celery`` commands share: exit codes, consoles, errors, options, loading.

Every command module imports from here (none imports :mod:`threads_celery.cli.app`, which
assembles them): the exit codes, the two consoles, :func:`friendly_errors` (a library error is one
red line and exit code 2, never a traceback), the options several commands take, loading an agent
from a ``MODULE:AGENT`` spec, opening the runtime the environment describes, and the JSON form of
runs, messages and child runs.
"""

from __future__ import annotations

import functools
import getpass
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from threads_celery.exceptions import ConfigError, ThreadsError
from threads_celery.records import AgentToolRun, Message, Run
from threads_celery.settings import Settings

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.definitions.agents import Agent

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_NEEDS_A_PERSON = 3
EXIT_TIMEOUT = 4

DEFAULT_EMBEDDED_DB = Path(".threads-celery") / "embedded.db"

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

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
        agents = import_agents(module_spec, shown=spec.strip().partition(":")[0])
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
    return Settings.from_env()


def open_threads(db: Path | None, *, need_broker: bool = True) -> Threads:
    """The runtime handle: embedded at ``db`` (or the default path) unless THREADS_* URLs are set.

    Read-only commands pass ``need_broker=False``: they only read the ledger.
    """
    from threads_celery.client.threads import Threads
    from threads_celery.transitions.publishing import EMBEDDED_BROKER

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
