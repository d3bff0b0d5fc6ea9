"""``threads-celery deploy status/set-current/ramp/rollback/retire`` and ``threads-celery runs
upgrade``: deployment versions, as :mod:`threads_celery.transitions.deploy_control` and
:mod:`threads_celery.runtime.deploys` implement them."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from threads_celery.cli.common import (
    EXIT_RUN_FAILED,
    JsonFlag,
    UsageError,
    fail,
    friendly_errors,
    out,
    require_services,
)

if TYPE_CHECKING:
    from threads_celery.settings import Settings
    from threads_celery.store import Store

deploy_app = typer.Typer(
    help=(
        "Deployment versions: which code each run is on, where new runs start.\n\n\b\n"
        "  threads-celery deploy status\n"
        "  threads-celery deploy ramp v2 --percentage 10\n"
        "  threads-celery deploy set-current v2\n"
        "  threads-celery deploy rollback\n"
        "  threads-celery deploy retire v1"
    ),
    no_args_is_help=True,
)

STATE_STYLES = {"active": "green", "draining": "yellow", "drained": "dim", "retired": "dim"}


def _store() -> tuple[Store, Settings]:
    from threads_celery.transitions.publishing import open_store

    settings = require_services(broker=False)
    assert settings.database_url is not None
    return open_store(settings.database_url, settings), settings


@deploy_app.command("status")
@friendly_errors
def status(as_json: JsonFlag = False) -> None:
    """Each version: its state, its live workers, its unfinished runs by status, and the runs
    stranded on it (no live worker). Exit status 1 when a run is stranded."""
    from threads_celery.transitions.deploy_control import status_document

    store, settings = _store()
    try:
        document = status_document(store, settings)
    finally:
        store.dispose()
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        _print_status(document)
    if document["stranded"]:
        raise typer.Exit(EXIT_RUN_FAILED)


def _print_status(document: dict[str, object]) -> None:
    versions = document["versions"]
    assert isinstance(versions, list)
    if not versions:
        out.print("no deployment versions: workers run without THREADS_DEPLOY_VERSION", style="dim")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("version", "state", "role", "workers", "unfinished runs", "stranded"):
        table.add_column(name, no_wrap=name != "unfinished runs")
    for v in versions:
        role = v["role"] or ""
        if role == "ramping":
            role = f"ramping {v['ramp_percent']}%"
        runs = ", ".join(f"{status} {count}" for status, count in v["runs"].items()) or "-"
        stranded = Text(str(v["stranded"]), style="bold red") if v["stranded"] else Text("0", style="dim")
        table.add_row(
            v["version"], Text(v["state"], style=STATE_STYLES.get(v["state"], "")), role,
            str(len(v["workers"])), runs, stranded,
        )  # fmt: skip
    out.print(table)
    for v in versions:
        if v["stranded"]:
            out.print(
                Text(
                    f"version {v['version']}: {v['stranded']} unfinished run(s) and no live worker; start a worker "
                    f"of it, or move them: threads-celery runs upgrade --from {v['version']} --to VERSION",
                    style="red",
                ),
                soft_wrap=True,
            )
        for reason, count in v["pinned_reasons"].items():
            out.print(Text(f"version {v['version']}: {count} run(s) pinned: {reason}", style="yellow"), soft_wrap=True)


@deploy_app.command("set-current")
@friendly_errors
def set_current(version: Annotated[str, typer.Argument(help="The version new runs start on.")]) -> None:
    """Make VERSION current: new runs start on it at once (runs already placed stay)."""
    from threads_celery.transitions import deploy_control

    store, _ = _store()
    try:
        deploy_control.set_current(store, version)
    finally:
        store.dispose()
    out.print(f"new runs start on {version}")


@deploy_app.command("ramp")
@friendly_errors
def ramp(
    version: Annotated[str, typer.Argument(help="The version to send a share of new runs to.")],
    percentage: Annotated[int, typer.Option("--percentage", "-p", help="The share, 0-100 (0 ends the ramp).")],
) -> None:
    """Send PERCENTAGE of new runs to VERSION, the rest to the current version."""
    from threads_celery.transitions import deploy_control

    store, _ = _store()
    try:
        deploy_control.set_ramping(store, version, percentage)
    finally:
        store.dispose()
    out.print(f"{percentage}% of new runs start on {version}" if percentage else "the ramp ended")


@deploy_app.command("rollback")
@friendly_errors
def rollback() -> None:
    """End any ramp and make the version current before this one current again, at once."""
    from threads_celery.transitions import deploy_control

    store, _ = _store()
    try:
        version = deploy_control.rollback(store)
    finally:
        store.dispose()
    out.print(f"new runs start on {version}")


@deploy_app.command("retire")
@friendly_errors
def retire(version: Annotated[str, typer.Argument(help="The version to retire.")]) -> None:
    """Retire VERSION: refused while it is current or an unfinished run is pinned to it."""
    from threads_celery.transitions import deploy_control

    store, _ = _store()
    try:
        deploy_control.retire(store, version)
    finally:
        store.dispose()
    out.print(f"version {version} retired")


@friendly_errors
def runs_upgrade(
    from_version: Annotated[str, typer.Option("--from", help="Move the unfinished runs of this version.")],
    to_version: Annotated[str, typer.Option("--to", help="The version of the agents loaded here.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check only; move nothing.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many runs.")] = 10_000,
    as_json: JsonFlag = False,
) -> None:
    """Move the unfinished runs of one version to another, each after the compatibility check
    (the same as an upgrading run's), with a report per run. Run it where the target version's
    code is: THREADS_AGENTS and THREADS_DEPLOY_VERSION (or auto) must give --to.

    \b
      threads-celery runs upgrade --from v1 --to v2 --dry-run
      threads-celery runs upgrade --from v1 --to v2
    """
    from celery import Celery

    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.runtime import deploys
    from threads_celery.runtime.machine import Runtime
    from threads_celery.transitions.publishing import Publisher, celery_app
    from threads_celery.worker.application import resolve_deploy_version

    settings = require_services(broker=not dry_run)
    if not settings.agents:
        raise UsageError("THREADS_AGENTS is not set: the target version's agents must be loaded to check runs")
    registry = AgentRegistry()
    settings = resolve_deploy_version(settings, registry)
    registry.load(settings.agents)
    if settings.deploy_version != to_version:
        fail(
            f"the agents loaded here are version {settings.deploy_version or '(none: THREADS_DEPLOY_VERSION unset)'}, "
            f"not {to_version}; run this where {to_version}'s code is"
        )
    if from_version == to_version:
        raise UsageError("--from and --to are the same version")
    store, _ = _store()
    app: Celery = celery_app(settings, broker_url=settings.broker_url if not dry_run else "memory://")
    runtime = Runtime(store, registry, publish=Publisher(app), settings=settings)
    try:
        with store.read() as tx:
            candidates = tx.runs_on_version(from_version, limit=limit)
        reports = [deploys.upgrade_run(runtime, run.id, to_version, dry_run=dry_run) for run in candidates]
    finally:
        store.dispose()
    if as_json:
        sys.stdout.write(json.dumps([r.as_dict() for r in reports], indent=2) + "\n")
        return
    if not reports:
        out.print(f"no unfinished runs on {from_version}", style="dim")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("reason")
    styles = {"moved": "green", "compatible": "green", "pinned": "yellow", "not_yet": "cyan"}
    for r in reports:
        table.add_row(r.run_id, Text(r.outcome, style=styles.get(r.outcome, "")), r.reason)
    out.print(table)
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    out.print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + (" (dry run)" if dry_run else ""))
