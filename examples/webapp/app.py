"""A small web app that enqueues agent runs and shows each one live.

    python -m examples.webapp.app                  # embedded: http://127.0.0.1:8000
    python -m examples.webapp.app --port 8080 --db /tmp/webapp.db

What it does:

- ``GET /`` is a form (agent name, message) and the recent runs. ``POST /runs`` starts a run by
  agent name with :meth:`Threads.start` and answers ``303 See Other`` to ``/runs/{run_id}``.
- ``GET /runs/{run_id}`` is the run's page: its timeline (messages, tool calls and results,
  child agent-tool runs with a progress bar, phase and milestones, the final answer), drawn by
  ``static/run.js`` from ``GET /runs/{run_id}/events``, a Server-Sent Events stream this app
  serves from ``threads.events(thread_id, after=<Last-Event-ID>, follow=True)``. A browser that
  reconnects sends ``Last-Event-ID`` and gets only what it missed. Plain ``EventSource``, no build
  step.
- A call that waits for approval shows Approve and Deny buttons; they ``POST`` to
  ``/calls/{effect_key}/approve`` or ``/deny``, which call ``threads.approve`` or ``threads.deny``.
  (A real app would put its own login in front of these and pass the person as ``principal``.)

The app imports :mod:`threads_celery.client` (and its exceptions) and nothing else: no tool code, no
model layer. With ``THREADS_DATABASE_URL`` and ``THREADS_BROKER_URL`` set it is a client of your
workers (which load the agents, ``THREADS_AGENTS``), and enqueues runs by name. With neither set,
``python -m examples.webapp.app`` runs embedded (:meth:`Threads.embedded`: SQLite and an
in-process worker) and, for that worker only, loads the agents named by ``--agents`` (default:
``examples.research`` and ``examples.demo``). The research coordinator's detached import and
awaited researchers report progress; its import tool and the trip planner's booking and email
ask for approval.

``create_app(threads)`` builds the FastAPI app around a runtime you already hold.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles

from threads_celery import UsageTotals
from threads_celery.client import Threads
from threads_celery.exceptions import BrokerUnavailable, RunNotFound, StoreUnavailable, ThreadsError

HERE = Path(__file__).resolve().parent
DEFAULT_AGENTS = ("examples.research", "examples.demo")
PRINCIPAL = "webapp"
#: How long one ``threads.events(..., follow=True)`` tail lasts before the stream sends a
#: keep-alive comment and tails again (so a closed connection frees its thread within this).
TAIL_S = 10.0
MAX_FORM_BYTES = 64 * 1024

log = logging.getLogger("examples.webapp")


def _template(name: str) -> Template:
    return Template((HERE / "templates" / name).read_text(encoding="utf-8"))


def _usage_text(usage: UsageTotals) -> str:
    """``2 model calls · 1,234 tokens in · 56 out · cost 0.0012``."""
    text = f"{usage.requests} model calls · {usage.input_tokens:,} tokens in · {usage.output_tokens:,} out"
    return text if usage.cost is None else f"{text} · cost {usage.cost:.6g}"


def _page(name: str, status_code: int = 200, **values: str) -> HTMLResponse:
    return HTMLResponse(_template(name).substitute(**values), status_code=status_code)


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body as a dict (first value of each field)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True).items()}


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def sse_frame(seq: int, type: str, data: dict[str, Any]) -> str:
    """One SSE frame; JSON has no raw newline, so ``data`` fits on one line."""
    return f"id: {seq}\nevent: {type}\ndata: {json.dumps(data, default=str)}\n\n"


def run_event_stream(
    threads: Threads, thread_id: str, run_id: str, after: int, *, tail_s: float = TAIL_S
) -> Iterator[str]:
    """The run's events after ``after`` (replay, then live), as SSE frames, forever.

    Events of other runs on the same thread (``thread="accumulate"`` schedules, queued messages)
    are skipped. Every ``tail_s`` seconds of tailing a keep-alive comment is sent, which is also
    when a disconnected client is noticed.
    """
    yield "retry: 1000\n\n"
    cursor = after
    while True:
        for event in threads.events(thread_id, after=cursor, follow=True, timeout=tail_s):
            cursor = event.seq
            if event.run_id not in (None, run_id):
                continue
            data = {"seq": event.seq, "type": event.type, "run_id": event.run_id, "payload": event.payload}
            yield sse_frame(event.seq, event.type, data)
        yield ": keep-alive\n\n"


def create_app(threads: Threads, *, agent_names: Sequence[str] = (), principal: str = PRINCIPAL) -> FastAPI:
    """The web app around ``threads``; ``agent_names`` fills the form's suggestions."""
    app = FastAPI(title="threads-celery web app example")

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(BrokerUnavailable)
    async def unavailable(request: Request, exc: Exception) -> Response:
        # A database or broker that is down (or restarting) is "try again", never "no such run".
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        message = "The service is briefly unavailable; try again in a moment."
        if _wants_json(request) or request.url.path.endswith("/events"):
            return JSONResponse({"error": message}, status_code=503, headers={"Retry-After": "1"})
        return HTMLResponse(f"<p>{html.escape(message)}</p>", status_code=503, headers={"Retry-After": "1"})

    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    names = list(agent_names)

    def index_page(error: str = "", message: str = "", agent: str = "", status_code: int = 200) -> HTMLResponse:
        rows = []
        for run in threads.runs(limit=50):
            if run.agent_tool_run_id is not None:
                continue  # a child run: shown on its parent's page
            rows.append(
                f'<li><a href="/runs/{quote(run.id, safe="")}">{html.escape(run.id)}</a> '
                f'<span class="badge status-{html.escape(run.status)}">{html.escape(run.status)}</span> '
                f"{html.escape(run.agent)}: {html.escape(run.input[:80])}</li>"
            )
        options = "".join(f'<option value="{html.escape(n)}"></option>' for n in names)
        return _page(
            "index.html",
            status_code,
            agent=html.escape(agent or (names[0] if names else "")),
            agent_options=options,
            message=html.escape(message),
            error=f'<p class="error" id="form-error">{html.escape(error)}</p>' if error else "",
            runs="\n".join(rows) or "<li>No runs yet.</li>",
        )

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return index_page()

    @app.post("/runs")
    async def start_run(request: Request) -> Response:
        form = await _form(request)
        agent, message = form.get("agent", "").strip(), form.get("message", "").strip()
        if not agent or not message:
            return index_page("Name an agent and write a message.", message, agent, status_code=400)
        try:
            handle = threads.start(agent, message)
        except (StoreUnavailable, BrokerUnavailable):
            raise
        except (ThreadsError, ValueError) as exc:
            return index_page(str(exc), message, agent, status_code=400)
        return RedirectResponse(f"/runs/{quote(handle.run_id, safe='')}", status_code=303)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(run_id: str) -> HTMLResponse:
        try:
            run = threads.get_run(run_id)
        except RunNotFound:
            return _page("missing.html", 404, run_id=html.escape(run_id))
        return _page(
            "run.html",
            run_id=html.escape(run.id),
            run_id_attr=html.escape(run.id, quote=True),
            thread_id=html.escape(run.thread_id),
            agent=html.escape(run.agent),
            input=html.escape(run.input),
            status=html.escape(run.status),
            usage=html.escape(_usage_text(threads.usage(run_id=run.id))),
        )

    @app.get("/runs/{run_id}/usage")
    def run_usage(run_id: str) -> JSONResponse:
        """The run's model usage so far (requests, tokens, cost), and the same as one line."""
        try:
            threads.get_run(run_id)
        except RunNotFound:
            return JSONResponse({"error": f"no run {run_id}"}, status_code=404)
        usage = threads.usage(run_id=run_id)
        return JSONResponse({**usage.to_json(), "text": _usage_text(usage)})

    @app.get("/runs/{run_id}/events")
    def run_events(run_id: str, request: Request, after: int = 0) -> Response:
        try:
            run = threads.get_run(run_id)
        except RunNotFound:
            return JSONResponse({"error": f"no run {run_id}"}, status_code=404)
        last_id = request.headers.get("last-event-id", "").strip()
        cursor = int(last_id) if last_id.isdigit() else max(after, 0)
        return StreamingResponse(
            run_event_stream(threads, run.thread_id, run.id, cursor),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/runs/{run_id}/pending")
    def pending(run_id: str) -> JSONResponse:
        """The run's calls waiting for a person (awaiting approval, or parked), its child runs' too."""
        try:
            waiting = threads.pending(run_id)
        except ThreadsError:
            return JSONResponse({"error": f"no run {run_id}"}, status_code=404)
        calls = [
            {
                "effect_key": c.effect_key,
                "tool": c.tool,
                "args": c.args,
                "status": c.status,
                "reason": c.reason,
                "kind": c.kind,
                "agent": c.agent,
            }
            for c in waiting
        ]
        return JSONResponse(calls)

    async def decide(request: Request, effect_key: str, approve: bool) -> Response:
        form = await _form(request)
        try:
            if approve:
                threads.approve(effect_key, principal=principal, remember=form.get("remember") == "1")
            else:
                threads.deny(effect_key, form.get("reason") or "denied in the web app", principal=principal)
        except (StoreUnavailable, BrokerUnavailable):
            raise
        except ThreadsError as exc:
            if _wants_json(request):
                return JSONResponse({"ok": False, "error": str(exc)}, status_code=409)
            return HTMLResponse(f"<p>{html.escape(str(exc))}</p>", status_code=409)
        if _wants_json(request):
            return JSONResponse({"ok": True, "decision": "approved" if approve else "denied"})
        run_id = form.get("run_id", "")
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}" if run_id else "/", status_code=303)

    @app.post("/calls/{effect_key}/approve")
    async def approve(effect_key: str, request: Request) -> Response:
        return await decide(request, effect_key, True)

    @app.post("/calls/{effect_key}/deny")
    async def deny(effect_key: str, request: Request) -> Response:
        return await decide(request, effect_key, False)

    return app


def _load_agents(threads: Threads, specs: Sequence[str]) -> list[str]:
    """Register the agents of ``specs`` with the embedded runtime (tool code: embedded only).

    Returns their names, each module's ``agent`` first (the one to offer by default).
    """
    import importlib

    first: list[str] = []
    rest: list[str] = []
    for spec in specs:
        for agent in threads.registry.load(spec):
            threads.register(agent)
            rest.append(agent.name)
        main_agent = getattr(importlib.import_module(spec.partition(":")[0]), "agent", None)
        if getattr(main_agent, "name", None) in rest:
            first.append(main_agent.name)  # type: ignore[union-attr]
    return first + [n for n in dict.fromkeys(rest) if n not in first]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.webapp.app", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--db", default=str(Path(".threads-celery") / "webapp.db"), help="embedded SQLite file")
    parser.add_argument(
        "--agents",
        default=",".join(DEFAULT_AGENTS),
        help="comma-separated agent modules to load when embedded (default: %(default)s)",
    )
    args = parser.parse_args(argv)

    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def serve(app: FastAPI) -> None:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=2)

    if os.environ.get("THREADS_DATABASE_URL") or os.environ.get("THREADS_BROKER_URL"):
        # A client of your workers: they load the agents; the app only names them.
        with Threads() as threads:
            names = [n.strip() for n in os.environ.get("WEBAPP_AGENT_NAMES", "").split(",") if n.strip()]
            serve(create_app(threads, agent_names=names))
        return
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    with Threads.embedded(path=args.db) as threads:
        names = _load_agents(threads, [s.strip() for s in args.agents.split(",") if s.strip()])
        log.info("embedded runtime on %s with agents: %s", args.db, ", ".join(names))
        started = time.monotonic()
        serve(create_app(threads, agent_names=names))
        log.info("served for %.0fs", time.monotonic() - started)


if __name__ == "__main__":
    main()
