"""``threads-celery worker``, ``beat``, ``flower``, ``api`` and ``db``: the long-running services and migrations."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ParamSpec, TypeVar

import typer

from threads_celery.cli.common import (
    DEFAULT_EMBEDDED_DB,
    UsageError,
    err,
    fail,
    friendly_errors,
    out,
    require_services,
    resolve_spec,
    settings_from_env,
)
from threads_celery.exceptions import ConfigError, ThreadsError
from threads_celery.worker.flower_gate import flower_credentials, start_flower

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from threads_celery.worker.application import ThreadsCelery

P = ParamSpec("P")
R = TypeVar("R")

db_app = typer.Typer(
    help="Database migrations.\n\n\b\n  threads-celery db upgrade --database-url postgresql://app@db/threads\n  threads-celery db current",
    no_args_is_help=True,
)


class Pool(str, Enum):
    prefork = "prefork"
    threads = "threads"
    solo = "solo"


# -- refusals ----------------------------------------------------------------------------------


def refuses_to_start(service: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A service command whose library errors read as ``error: <service> cannot start: ...``.

    The same one line, and the same exit status 2, as ``celery -A tasks worker`` or ``beat`` print
    when they refuse (:func:`threads_celery.runtime.preflight.refuse`), never a traceback.
    """

    def decorate(command: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(command)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return command(*args, **kwargs)
            except ThreadsError as exc:
                # Here, not at the top: the preflight loads SQLAlchemy, and --help stays fast.
                from threads_celery.runtime.preflight import one_line

                fail(f"{service} cannot start: {one_line(exc)}")

        return wrapper

    return decorate


# -- worker and beat ---------------------------------------------------------------------------


PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@refuses_to_start("worker")
def worker(
    ctx: typer.Context,
    agents: Annotated[
        str | None,
        typer.Option(
            "--agents",
            help="Comma-separated agent specs to load (module, module:attr or file.py:attr); sets THREADS_AGENTS.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", min=1, help="Worker processes/threads [default: CPU count].")
    ] = None,
    pool: Annotated[Pool, typer.Option("--pool", "-P", help="Celery execution pool.")] = Pool.prefork,
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            "-Q",
            help="Comma-separated queues to consume [default: threads]. Include 'threads' unless another worker serves it; "
            "'threads.control' (the backbone) is always added.",
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
) -> None:
    """Run a Celery worker that executes model steps and tool calls.

    Needs THREADS_DATABASE_URL and THREADS_BROKER_URL. Load every agent a run can reach,
    including child agents that tools start in the background (a bare module loads all of its
    agents). Every other `celery worker` option is passed through as is (--autoscale, -n,
    --max-tasks-per-child, -O, --without-gossip, ...; see `celery worker --help`).

    \b
      threads-celery worker --agents myapp.agents --concurrency 4
      threads-celery worker --agents examples/demo.py:agent --pool threads -Q threads,email
      threads-celery worker --agents myapp.agents --autoscale 8,2 -n slow@%h -Q slow-tools
    """
    require_services()
    if agents:
        os.environ["THREADS_AGENTS"] = ",".join(resolve_spec(s) for s in agents.split(",") if s.strip())
    else:
        specs = [s for s in os.environ.get("THREADS_AGENTS", "").split(",") if s.strip()]
        if not specs:
            raise ConfigError("no agents to run: pass --agents myapp.agents or set THREADS_AGENTS")
        os.environ["THREADS_AGENTS"] = ",".join(resolve_spec(s) for s in specs)
    from threads_celery.worker.application import app_from_environment

    celery_app = app_from_environment()
    _preflight(celery_app, "worker")
    argv = ["worker", f"--loglevel={loglevel.upper()}", f"--pool={pool.value}"]
    if concurrency is not None:
        argv.append(f"--concurrency={concurrency}")
    if queues:
        argv.append(f"--queues={queues}")
    _run_celery(celery_app, [*argv, *ctx.args])


def _run_celery(celery_app: ThreadsCelery, argv: list[str]) -> None:
    """Run Celery's own ``worker`` or ``beat`` command, its usage errors as one line and exit 2.

    Celery parses the options passed through (``--autoscale``, ``-n``, ...) itself, with click, and
    run this way its usage errors would end in a traceback. Here a typo reads as Celery's own
    command says it (``No such option '--concurency'. Did you mean '--concurrency'?``), and the
    command's exit status is this process's.
    """
    from click.exceptions import Abort, ClickException

    try:
        code: int | None = celery_app.start(argv)
    except ClickException as exc:
        raise UsageError(exc.format_message()) from None
    except Abort:
        raise typer.Exit(1) from None
    if code:
        raise typer.Exit(code)


def _preflight(celery_app: ThreadsCelery, service: str) -> None:
    """Fail now, with one clear line, if the ledger is not ready or an agent cannot run here."""
    from threads_celery.worker.application import preflight

    ready = preflight(celery_app, service=service)
    err.print(f"agents: {', '.join(ready.agents) or 'none'}", style="dim")


@refuses_to_start("beat")
def beat(
    ctx: typer.Context,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
    schedule: Annotated[
        Path | None,
        typer.Option(
            "--schedule",
            "-s",
            help="Beat's schedule state file [default: .threads-celery/celerybeat-schedule].",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Run Celery beat: the reconcile backbone.

    It ticks every THREADS_RECONCILE_INTERVAL_S seconds (default 5). Run exactly one beat per deployment (a second one is safe, just wasteful).
    Every other `celery beat` option is passed through as is (--max-interval, --pidfile, ...).

    \b
      threads-celery beat
      threads-celery beat --schedule /var/lib/threads/beat-schedule
    """
    require_services()
    from threads_celery.worker.application import app_from_environment

    celery_app = app_from_environment()
    _preflight(celery_app, "beat")
    schedule = schedule or Path(celery_app.conf.beat_schedule_filename)
    schedule.parent.mkdir(parents=True, exist_ok=True)
    _run_celery(celery_app, ["beat", f"--loglevel={loglevel.upper()}", f"--schedule={schedule}", *ctx.args])


# -- flower ------------------------------------------------------------------------------------


@refuses_to_start("flower")
def flower(
    address: Annotated[
        str, typer.Option("--address", help="Address to listen on (0.0.0.0 in a container).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 5555,
) -> None:
    """Run Flower behind basic authentication, /metrics included.

    Needs THREADS_BROKER_URL, FLOWER_USER and FLOWER_PASSWORD; refuses to start when either
    credential is empty. /healthcheck stays open for health probes.

    \b
      FLOWER_USER=admin FLOWER_PASSWORD=change-me threads-celery flower
      threads-celery flower --address 0.0.0.0 --port 5555
    """
    flower_credentials(os.environ)  # before touching the broker: a missing password is one red line
    require_services(database=False)
    from threads_celery.worker.application import app_from_environment

    start_flower(app_from_environment(), os.environ, address=address, port=port)


# -- api ---------------------------------------------------------------------------------------


@refuses_to_start("api")
def api(
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0 in a container).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8000,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="debug, info, warning, error.")] = "info",
    embedded: Annotated[
        bool,
        typer.Option(
            "--embedded",
            help="With neither THREADS_DATABASE_URL nor THREADS_BROKER_URL set, serve the embedded "
            f"SQLite store ({DEFAULT_EMBEDDED_DB}) with an in-process worker, to try things out.",
        ),
    ] = False,
) -> None:
    """Serve the HTTP API (start runs, read them, stream events, approve, deny, resolve).

    Routes under /v1 need `Authorization: Bearer <token>` with a token from THREADS_API_TOKENS
    (comma-separated); set THREADS_API_AUTH=off only behind something that authenticates.
    THREADS_AGENTS names the agents whose tool schemas approvals with edited arguments are checked
    against; with --embedded, its in-process worker runs them, so that a decision taken here
    continues its run. OpenAPI at /openapi.json; /healthz and /readyz are open. The operations console is
    at /console (sign in with one of the tokens; THREADS_CONSOLE=0 turns it off).

    \b
    Needs THREADS_DATABASE_URL and THREADS_BROKER_URL, a database at the latest migration, or
    --embedded.

    \b
      THREADS_API_TOKENS=change-me threads-celery api
      threads-celery api --host 0.0.0.0 --port 8000
      THREADS_API_TOKENS=change-me threads-celery api --embedded
    """
    import uvicorn

    from threads_celery.api.app import app_from_environment

    # As the worker takes them: a spec may name a file (examples/demo.py:agent).
    specs = [s for s in os.environ.get("THREADS_AGENTS", "").split(",") if s.strip()]
    if specs:
        os.environ["THREADS_AGENTS"] = ",".join(resolve_spec(s) for s in specs)

    api_app = app_from_environment(embedded=embedded)  # here, not in uvicorn: a bad configuration is one red line
    uvicorn.run(api_app, host=host, port=port, log_level=loglevel.lower(), proxy_headers=True)


# -- db ----------------------------------------------------------------------------------------


@contextmanager
def _engine(database_url: str | None) -> Iterator[Engine]:
    from sqlalchemy.exc import OperationalError

    from threads_celery.store.availability import store_unavailable
    from threads_celery.transitions.publishing import open_store

    url = database_url or settings_from_env().database_url or f"sqlite:///{DEFAULT_EMBEDDED_DB}"
    store = open_store(url)
    try:
        yield store.engine
    except OperationalError as exc:  # what a migration or a revision check meets when the server is away
        raise store_unavailable(store.engine.url, exc) from exc
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
    from threads_celery.store.engine import safe_url
    from threads_celery.store.migrate import current_revision, head_revision, upgrade

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
    from threads_celery.store.engine import safe_url
    from threads_celery.store.migrate import current_revision, head_revision

    if database_url is None and not settings_from_env().database_url and not DEFAULT_EMBEDDED_DB.exists():
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
