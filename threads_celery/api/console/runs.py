"""The console's runs: the list (filters, search, pages, counts), a run's page and its live stream.

A run page shows its tree (the run it came from, and the runs it started: agent tools, subagents,
detached runs), its timeline (:func:`~threads_celery.api.console.views.timeline`), its usage and
why it ended or waits. Results are previews in the timeline; a whole result is read page by page
(``/calls/{effect_key}/result``), so a 50 MB result never reaches the page in one piece.
The page follows the run's thread through ``/runs/{id}/events``: the ``/v1`` event stream,
authorized by the console's session cookie (an ``EventSource`` sends no Authorization header).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from threads_celery.api.bodies import EFFECT_KEY_PATTERN, ID_PATTERN, MAX_SEQ
from threads_celery.api.console.inbox import RUN_BACK, NoticeToken, answer_context
from threads_celery.api.console.notices import Notice
from threads_celery.api.console.pages import Console, NotFound
from threads_celery.api.console.views import (
    PREVIEW_CHARS,
    RESULT_PAGE_CHARS,
    RUN_STATUSES,
    ended_because,
    run_tree,
    timeline,
)
from threads_celery.api.events import DEFAULT_KEEPALIVE_S, DEFAULT_POLL_INTERVAL_S, event_stream, parse_cursor
from threads_celery.api.tenancy import Caller, owned_call, owned_run, owned_thread, shown_to
from threads_celery.exceptions import RunNotFound, ThreadNotFound
from threads_celery.records import Run

PAGE_SIZE = 50
RunId = Annotated[str, Path(pattern=ID_PATTERN)]
EffectKey = Annotated[str, Path(pattern=EFFECT_KEY_PATTERN)]


def _moment(raw: str | None) -> datetime | None:
    """A ``datetime-local`` field's value (or an ISO timestamp) as UTC; None when blank or not a time."""
    if not raw:
        return None
    try:
        at = datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _cursor(raw: str | None) -> tuple[datetime, str] | None:
    """The ``before`` cursor of the next page: ``<created_at ISO>|<run id>``."""
    if not raw or "|" not in raw:
        return None
    at, _, run_id = raw.partition("|")
    moment = _moment(at)
    return (moment, run_id) if moment is not None and run_id else None


def _search(console: Console, caller: Caller, q: str) -> tuple[str | None, str | None]:
    """A search's stored run id or thread id (the caller's own), else (None, None)."""
    threads = console.threads
    try:
        return owned_run(threads, caller, q), None
    except RunNotFound:
        pass
    try:
        return None, owned_thread(threads, caller, q)
    except ThreadNotFound:
        return None, None


def add_routes(app: FastAPI, console: Console) -> None:
    """The runs list, the counts, a run's page, its timeline and stream, and result pages."""
    threads = console.threads

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def runs_list(
        request: Request,
        agent: Annotated[str | None, Query(max_length=128)] = None,
        status: Annotated[str | None, Query(max_length=32)] = None,
        since: Annotated[str | None, Query(max_length=40)] = None,
        until: Annotated[str | None, Query(max_length=40)] = None,
        q: Annotated[str | None, Query(max_length=300)] = None,
        before: Annotated[str | None, Query(max_length=400)] = None,
    ) -> Response:
        session = console.session(request)
        caller = session.caller
        q = (q or "").strip()
        run_id = thread_id = None
        if q:
            run_id, thread_id = _search(console, caller, q)
        found: list[Run] = []
        if run_id is not None:
            found = [threads.get_run(run_id)]
        elif not q or thread_id is not None:
            with threads.store.read() as tx:
                found = tx.console_runs(
                    tenant=caller.tenant,
                    agent=agent or None,
                    statuses=[status] if status in RUN_STATUSES else None,
                    since=_moment(since),
                    until=_moment(until),
                    thread_id=thread_id,
                    before=_cursor(before),
                    limit=PAGE_SIZE + 1,
                )
        more = len(found) > PAGE_SIZE
        found = found[:PAGE_SIZE]
        last = found[-1] if more and found else None
        with threads.store.read() as tx:
            counts = tx.run_status_counts(caller.tenant)
            agents = [a["name"] for a in tx.agent_descriptions()]
        filters = {"agent": agent or "", "status": status or "", "since": since or "", "until": until or "", "q": q}
        next_cursor = f"{last.created_at.isoformat() if last.created_at else ''}|{last.id}" if last else None
        return console.render(
            request,
            "runs.html",
            session=session,
            runs=found,
            counts=counts,
            statuses=RUN_STATUSES,
            agents=agents,
            filters=filters,
            next_cursor=next_cursor,
            searched_nothing=bool(q) and run_id is None and thread_id is None,
        )

    @app.get("/counts", response_class=HTMLResponse, include_in_schema=False)
    def counts(request: Request) -> Response:
        session = console.session(request)
        with threads.store.read() as tx:
            found = tx.run_status_counts(session.caller.tenant)
        return console.render(request, "_counts.html", session=session, counts=found, statuses=RUN_STATUSES)

    def run_context(caller: Caller, run_id: str, notice: Notice | None = None) -> dict[str, Any]:
        stored = owned_run(threads, caller, run_id)
        run = threads.get_run(stored)
        with threads.store.read() as tx:
            turns = tx.model_turns(stored)
            calls = tx.call_timeline(stored, preview_chars=PREVIEW_CHARS)
            messages = tx.run_replies(run.thread_id, stored)
            thread = tx.get_thread(run.thread_id)
        parent = None
        if run.agent_tool_run_id is not None:
            row = threads.inspect_agent_tool_run(run.agent_tool_run_id)
            parent = row.parent_run_id if row is not None else None
        pending = threads.pending(stored)
        with threads.store.read() as tx:
            descriptions: dict[str, dict[str, Any]] = {}
            answers = [{"call": p, **answer_context(tx, p, p.agent or run.agent, descriptions)} for p in pending]
        return {
            "run": run,
            "parent_run_id": parent,
            "steps": timeline(run, turns, calls, messages),
            "tree": run_tree(lambda t: threads.agent_tool_runs(t), run),
            "usage": threads.usage(run_id=stored),
            "reason": ended_because(run, [p.reason for p in pending]),
            "pending": pending,
            # The pending calls' forms: answered here, as in the inbox, and back to this page.
            "answers": answers,
            "back": f"{RUN_BACK}{shown_to(caller)(run.id)}",
            "notice": notice,
            "preview_chars": PREVIEW_CHARS,
            # The page shows the ledger as of this event: its stream starts after it.
            "after": thread.event_seq if thread is not None else 0,
        }

    @app.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
    def run_page(request: Request, run_id: RunId, notice: NoticeToken = None) -> Response:
        session = console.session(request)
        found = console.notices.get(session.csrf, notice)
        context = run_context(session.caller, run_id, found)
        return console.render(request, "run.html", session=session, notice_token=notice, **context)

    @app.get("/runs/{run_id}/live", response_class=HTMLResponse, include_in_schema=False)
    def run_live(request: Request, run_id: RunId, notice: NoticeToken = None) -> Response:
        """The part of a run's page that changes: status, pending calls, tree and timeline."""
        session = console.session(request)
        found = console.notices.get(session.csrf, notice)
        context = run_context(session.caller, run_id, found)
        return console.render(request, "_run_live.html", session=session, **context)

    @app.get("/runs/{run_id}/events", include_in_schema=False)
    async def run_events(
        request: Request,
        run_id: RunId,
        after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        session = console.session(request)
        stored = await run_in_threadpool(owned_run, threads, session.caller, run_id)
        run = await run_in_threadpool(threads.get_run, stored)
        return StreamingResponse(
            event_stream(
                threads,
                run.thread_id,
                parse_cursor(last_event_id, after),
                keepalive_s=DEFAULT_KEEPALIVE_S,
                poll_interval_s=DEFAULT_POLL_INTERVAL_S,
                shown=shown_to(session.caller),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/calls/{effect_key}/result", response_class=HTMLResponse, include_in_schema=False)
    def result_page(
        request: Request, effect_key: EffectKey, page: Annotated[int, Query(ge=0, le=1_000_000)] = 0
    ) -> Response:
        session = console.session(request)
        stored = owned_call(threads, session.caller, effect_key)
        with threads.store.read() as tx:
            found = tx.result_page(stored, offset=page * RESULT_PAGE_CHARS, size=RESULT_PAGE_CHARS)
        if found is None:
            raise NotFound("call with this effect key")
        text, total = found
        pages = max(1, -(-total // RESULT_PAGE_CHARS))
        return console.render(
            request,
            "result.html",
            session=session,
            effect_key=effect_key,
            text=text,
            total=total,
            page=page,
            pages=pages,
        )


__all__ = ["add_routes"]
