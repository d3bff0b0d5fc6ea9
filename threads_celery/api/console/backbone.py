"""The console's agents and backbone page: what is registered, what is scheduled, what is running.

Agents are read from the ledger (what each worker recorded of its agents: tools, effects,
variables, model) and, for the agents this process loaded, their permission rules. Schedules are
the ``SCHEDULES`` of the ``THREADS_AGENTS`` modules, with their next firing. The backbone's
health is the outbox's depth and the most overdue row's lag (the reconcile lag, as the
Prometheus gauges read it) and the workers that answer a ping (as ``/readyz`` lists them). The
deployment versions are as ``threads-celery deploy status`` shows them, stranded runs first.
"""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse

from threads_celery.api.console.pages import Console
from threads_celery.api.readiness import census_of
from threads_celery.exceptions import ConfigError
from threads_celery.records import DEFAULT_TENANT
from threads_celery.runtime.schedules import Schedule, ScheduleRegistry
from threads_celery.transitions.deploy_control import status_document

log = logging.getLogger("threads_celery.api.console")


def _permissions(threads: Any, name: str) -> dict[str, Any] | None:
    """The permission rules of an agent this process loaded (mode, allow, ask, deny); None otherwise."""
    if name not in threads.registry:
        return None
    permissions = getattr(threads.registry.get(name), "permissions", None)
    if permissions is None:
        return {"mode": "default", "allow": (), "ask": (), "deny": ()}
    return {"mode": permissions.mode, "allow": permissions.allow, "ask": permissions.ask, "deny": permissions.deny}


def add_routes(app: FastAPI, console: Console) -> None:
    """``/agents``: agents, schedules and the backbone's health."""
    threads = console.threads
    census = functools.cache(lambda: census_of(threads))

    @functools.cache
    def schedules() -> list[Schedule]:
        registry = ScheduleRegistry()
        try:
            registry.load(threads.settings.agents)
        except ConfigError as exc:
            log.warning("console: the schedules of THREADS_AGENTS could not be read: %s", exc)
        return sorted(registry, key=lambda s: s.name)

    @app.get("/agents", response_class=HTMLResponse, include_in_schema=False)
    def agents_page(request: Request) -> Response:
        session = console.session(request)
        now = datetime.now(UTC)
        with threads.store.read() as tx:
            described = tx.agent_descriptions()
            snapshot = tx.metrics_snapshot(now)
        # Agents this process loaded and no worker recorded (an agent tool's child agent, say).
        recorded = {a["name"] for a in described}
        described += [{**a.describe(), "updated_at": None} for a in threads.registry if a.name not in recorded]
        described.sort(key=lambda a: str(a["name"]))
        loaded = {a["name"]: _permissions(threads, a["name"]) for a in described}
        return console.render(
            request,
            "agents.html",
            session=session,
            agents=described,
            permissions=loaded,
            schedules=[(s, s.next_after(now)) for s in schedules()],
            outbox_depth=snapshot.outbox_depth,
            reconcile_lag_s=snapshot.reconcile_lag_s,
            workers=census().workers(),
            # The fleet's, across tenants: shown to the operators' (default) tenant only.
            deploy=status_document(threads.store, threads.settings) if session.caller.tenant == DEFAULT_TENANT else {},
            now=now,
        )


__all__ = ["add_routes"]
