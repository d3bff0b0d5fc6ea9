"""The ``threads-celery`` command line: the Typer app, assembled from the command modules.

The other commands live beside this module, one noun each: :mod:`~threads_celery.cli.run`
(``run``), :mod:`~threads_celery.cli.runs` (``runs list/show/cancel/allow-usage``, ``events``,
``usage``), :mod:`~threads_celery.cli.threads` (``thread messages/branches/rewind/fork``),
:mod:`~threads_celery.cli.people` (``parked``, ``approve``, ``deny``, ``resolve``) and
:mod:`~threads_celery.cli.service` (``worker``, ``beat``, ``flower``, ``api``, ``db``). What they
share is in :mod:`~threads_celery.cli.common`. This module only assembles them on :data:`app`, so
no command module imports it.

The commands import the client, the worker, the store and the agent definitions inside the
functions that use them, not at the top of their modules: importing them costs about two seconds
(Celery, SQLAlchemy, Alembic, pydantic-ai), which ``threads-celery --help``, a mistyped option
and every command that fails its checks would otherwise pay before saying anything (0.3 s).

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

import os
import sys

import typer

from threads_celery.cli.deploy import deploy_app, runs_upgrade
from threads_celery.cli.history import history_app
from threads_celery.cli.people import approve, deny, parked, resolve
from threads_celery.cli.run import resume, run
from threads_celery.cli.runs import events, runs_app, usage_command
from threads_celery.cli.service import PASS_THROUGH, api, beat, db_app, flower, worker
from threads_celery.cli.threads import thread_app

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


@app.callback()
def main() -> None:
    # Like `python -m`, make modules in the current directory importable (agents, tools).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


# The commands, in the order `threads-celery --help` lists them (groups of sub-commands come last).
app.command()(run)
app.command()(resume)
app.command()(parked)
app.command()(approve)
app.command()(deny)
app.command()(resolve)
app.command()(events)
app.command("usage")(usage_command)
app.command(context_settings=PASS_THROUGH)(worker)
app.command(context_settings=PASS_THROUGH)(beat)
app.command()(flower)
app.command()(api)
app.add_typer(runs_app, name="runs")
app.add_typer(db_app, name="db")
app.add_typer(thread_app, name="thread")
app.add_typer(deploy_app, name="deploy")
runs_app.command("upgrade")(runs_upgrade)
app.add_typer(history_app, name="history")

if __name__ == "__main__":
    app()
