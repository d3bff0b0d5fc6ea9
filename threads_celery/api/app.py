"""The HTTP API for web apps: start and read runs, stream a thread's events, decide parked calls.

Serve it with the CLI or any ASGI server::

    THREADS_API_TOKENS=s3cret threads-celery api --host 127.0.0.1 --port 8000
    uvicorn --factory threads_celery.api.app:app_from_environment

Every route under ``/v1`` needs ``Authorization: Bearer <token>`` with a token from
``THREADS_API_TOKENS`` (comma-separated). With no token configured the API refuses to start,
unless ``THREADS_API_AUTH=off`` says, explicitly, that something in front of it authenticates.
Each token maps to a principal and a tenant (``principal@tenant=token``; a bare token is an
anonymous principal of the ``default`` tenant): a caller sees and acts on its tenant's threads,
runs and calls only, another tenant's ids answer as unused ones (404 where an id must exist), ids
a caller chooses are its tenant's own (two tenants may both use ``order-1``), and decisions are recorded under the
token's principal (see :mod:`threads_celery.api.tenancy`). An app with its own authentication passes
``create_api(threads, caller=dependency)`` instead: a FastAPI dependency answering each request's
:class:`~threads_celery.api.tenancy.Caller` (docs/fastapi.md); the tokens are then not used.
``/healthz`` (the process is up) and ``/readyz`` (the database and the broker answer; the workers
that answer a ping are listed, and ``?worker=N`` waits for ``N``) are open.

Errors always have the shape ``{"error": {"type": ..., "message": ...}}``: 401 unauthenticated,
404 unknown agent, run, thread or call, 409 a call not in the state the action needs (or a thread
of another agent), 413 a body over ``THREADS_API_MAX_BODY_BYTES`` (default 1 MiB), 422 a body
that is not valid JSON or does not fit the schema, 503 the database or broker is unavailable.
Errors never carry a stack trace, a database URL or a secret.

``GET /v1/threads/{id}/events`` is a Server-Sent Events stream: the thread's event log replayed
after a cursor (the ``Last-Event-ID`` header, else ``?after=``), then tailed live. Each frame has
``id: <seq>``, ``event: <type>`` and ``data: <json>``; sequence numbers are contiguous per thread
and committed in order, so a client that resumes from the last id it saw misses nothing and sees
nothing twice.


The app is assembled here from its parts: authentication (:mod:`~threads_celery.api.auth`), the
body limit (:mod:`~threads_celery.api.body_limit`), error answers (:mod:`~threads_celery.api.errors`),
the event stream (:mod:`~threads_celery.api.events`), and the routes of runs, threads and calls
below, of agent-tool runs (:mod:`~threads_celery.api.children`), of usage
(:mod:`~threads_celery.api.usage`), and of the chat front-ends' protocols: the Vercel AI SDK's UI
message stream (:mod:`~threads_celery.api.chat_vercel`) and AG-UI
(:mod:`~threads_celery.api.chat_agui`), which share :mod:`~threads_celery.api.chat_parts` and
:mod:`~threads_celery.api.chat_common`.
The operations console (:mod:`~threads_celery.api.console`) is mounted at ``/console`` unless
``THREADS_CONSOLE=0``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from threads_celery import __version__
from threads_celery.api.auth import (
    auth_from_env,
    bearer_auth,
    caller_dependency,
    callers_from_env,
    check_auth_config,
    unauthenticated,
)
from threads_celery.api.bodies import (
    EFFECT_KEY_PATTERN,
    ID_PATTERN,
    MAX_SEQ,
    Approve,
    CallResultOut,
    Decision,
    Deny,
    ErrorOut,
    MessageOut,
    PendingCallOut,
    Resolve,
    RunOut,
    RunStarted,
    StartRun,
)
from threads_celery.api.body_limit import BodyLimit, max_body_from_env
from threads_celery.api.branches import add_branch_routes
from threads_celery.api.chat_agui import add_ag_ui_routes
from threads_celery.api.chat_vercel import add_vercel_ai_routes
from threads_celery.api.children import add_agent_tool_routes
from threads_celery.api.console import console_enabled, create_console
from threads_celery.api.deploys import add_deploy_routes
from threads_celery.api.errors import ERROR_RESPONSES, ApiError, install_error_handlers
from threads_celery.api.events import (
    DEFAULT_KEEPALIVE_S,
    DEFAULT_POLL_INTERVAL_S,
    event_stream,
    last_event_seq,
    parse_cursor,
)
from threads_celery.api.history import add_history_routes
from threads_celery.api.readiness import install_health
from threads_celery.api.tenancy import (
    Caller,
    callers_from_tokens,
    owned_call,
    owned_run,
    owned_thread,
    run_to_start,
    shown_to,
    thread_to_start,
)
from threads_celery.api.usage import add_usage_routes
from threads_celery.client.threads import Threads
from threads_celery.exceptions import CallNotFound, ConfigError, ThreadNotFound
from threads_celery.records import RunStatus
from threads_celery.runtime.heap import settle_heap
from threads_celery.runtime.preflight import check_database, check_models, check_secret_key
from threads_celery.settings import Settings

log = logging.getLogger("threads_celery.api.app")


# -- the app -----------------------------------------------------------------------------------


def create_api(
    threads: Threads,
    *,
    caller: Callable[..., Any] | None = None,
    tokens: Iterable[str] | Mapping[str, Caller] | None = None,
    auth: bool | None = None,
    max_body_bytes: int | None = None,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    close_threads_on_shutdown: bool = False,
    console: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> FastAPI:
    """The FastAPI app serving ``threads``.

    ``tokens``, ``auth`` and ``max_body_bytes`` default to ``THREADS_API_TOKENS``,
    ``THREADS_API_AUTH`` and ``THREADS_API_MAX_BODY_BYTES``. ``tokens`` entries are read as
    ``THREADS_API_TOKENS`` entries are, or given as a mapping of token to :class:`Caller`. With
    authentication on (the default) and no token, this raises ConfigError: an API that anyone
    can drive is never the result of a missing variable.

    ``caller`` is the app's own authentication instead: a FastAPI dependency (sync or async, which
    may declare ``Request``, headers, cookies or other ``Depends``) that answers the request's
    :class:`Caller` or raises ``HTTPException`` (401, 403). With it, every ``/v1`` route and every
    console page asks it, no token is needed and ``THREADS_API_TOKENS`` is not read; ``tokens``
    or ``auth`` beside it is a TypeError. See :func:`~threads_celery.api.auth.caller_dependency`
    (what a dependency answering something else gets) and docs/fastapi.md.

    ``console`` (default: on unless ``THREADS_CONSOLE=0``) mounts the operations console at
    ``/console`` (:mod:`threads_celery.api.console`), signed in with the same tokens, or behind
    the same ``caller`` dependency (then with no sign-in page).
    """
    env = os.environ if env is None else env
    if caller is not None and (tokens is not None or auth is not None):
        raise TypeError("create_api: pass caller= or tokens=/auth=, not both (caller= replaces the tokens)")
    callers: dict[str, Caller] = {}
    if caller is not None:
        caller_of = caller_dependency(caller)
    else:
        auth = auth_from_env(env) if auth is None else auth
        callers = callers_from_env(env) if tokens is None else callers_from_tokens(tokens)
        check_auth_config(auth, set(callers))
        caller_of = bearer_auth(callers) if auth else unauthenticated
    max_body_bytes = max_body_from_env(env) if max_body_bytes is None else max_body_bytes
    if max_body_bytes <= 0:
        raise ConfigError(f"max_body_bytes must be positive, not {max_body_bytes}")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close_threads_on_shutdown:
                await run_in_threadpool(threads.close)

    app = FastAPI(
        title="threads-celery",
        version=__version__,
        description="Start durable agent runs, read them, stream their events and decide parked tool calls.",
        lifespan=lifespan,
    )
    app.state.threads = threads
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    install_error_handlers(app)
    install_health(app, threads)
    app.include_router(
        v1_routes(threads, caller_of, keepalive_s=keepalive_s, poll_interval_s=poll_interval_s, environ=env)
    )
    if console_enabled(env) if console is None else console:
        console_app = (
            create_console(threads, caller=caller, env=env)
            if caller is not None
            else create_console(threads, tokens=callers, auth=auth, env=env)
        )
        app.mount("/console", console_app)
    return app


# -- /v1 ---------------------------------------------------------------------------------------

RunId = Annotated[str, Path(pattern=ID_PATTERN, description="A run id, e.g. run_3f2a...")]
ThreadId = Annotated[str, Path(pattern=ID_PATTERN, description="A thread id.")]
EffectKey = Annotated[str, Path(pattern=EFFECT_KEY_PATTERN, description="A tool call's effect key.")]


def v1_routes(
    threads: Threads,
    caller_of: Callable[..., Any],
    *,
    keepalive_s: float,
    poll_interval_s: float,
    route_class: type[APIRoute] = APIRoute,
    environ: Mapping[str, str] | None = None,
) -> APIRouter:
    """The ``/v1`` routes, each asking ``caller_of`` (a dependency answering a :class:`Caller`).
    ``environ`` (default: the process's) says whether the history routes are on
    (``THREADS_API_HISTORY``, :mod:`threads_celery.api.history`).

    ``route_class`` is FastAPI's default for the API's own app (whose exception handlers answer
    errors), and :class:`~threads_celery.api.router.ApiRoute` for a router that goes into
    someone else's app.
    """
    # At the router too, so that no route can forget it; FastAPI runs it once per request.
    router = APIRouter(
        prefix="/v1", responses=ERROR_RESPONSES, dependencies=[Depends(caller_of)], route_class=route_class
    )
    # FastAPI's own type for extra OpenAPI responses.
    not_found: dict[int | str, dict[str, Any]] = {
        404: {"model": ErrorOut, "description": "No such agent, run, thread or call."}
    }
    conflict: dict[int | str, dict[str, Any]] = {
        409: {"model": ErrorOut, "description": "The call is not in a state that allows this."}
    }

    @router.post(
        "/runs",
        status_code=202,
        response_model=RunStarted,
        tags=["runs"],
        responses={**not_found, **conflict, 413: {"model": ErrorOut}},
    )
    def start_run(request: Request, body: StartRun, caller: Caller = Depends(caller_of)) -> JSONResponse:
        """Record a run and enqueue its first step; answers at once with its ids.

        Another tenant's ``thread_id`` or ``run_id`` is, for this caller, an unused one: the run
        starts on a thread of the caller's own (ids belong to their tenant).
        """
        thread_id = thread_to_start(threads, caller, body.thread_id) if body.thread_id is not None else None
        run_id = run_to_start(threads, caller, body.run_id) if body.run_id is not None else None
        handle = threads.start(body.agent, body.message, thread_id=thread_id, run_id=run_id, tenant=caller.tenant)
        shown = shown_to(caller)
        started = RunStarted(run_id=shown(handle.run_id), thread_id=shown(handle.thread_id), status=handle.status)
        # Where this router is served (its app mounted, or included under a prefix), the run is.
        location = f"{request.url.path.rstrip('/')}/{started.run_id}"
        return JSONResponse(started.model_dump(mode="json"), status_code=202, headers={"Location": location})

    @router.get("/runs", response_model=list[RunOut], tags=["runs"])
    def list_runs(
        thread_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
        status: RunStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        caller: Caller = Depends(caller_of),
    ) -> list[RunOut]:
        """Recent runs of the caller's tenant, newest first."""
        if thread_id is not None:
            try:
                thread_id = owned_thread(threads, caller, thread_id)
            except ThreadNotFound:
                return []  # a thread the caller does not have has no runs it can see
        found = threads.runs(thread_id=thread_id, status=status, limit=limit, tenant=caller.tenant)
        return [RunOut.of(r, shown_to(caller)) for r in found]

    @router.get("/runs/{run_id}", response_model=RunOut, tags=["runs"], responses=not_found)
    def get_run(run_id: RunId, caller: Caller = Depends(caller_of)) -> RunOut:
        """One run's current snapshot."""
        return RunOut.of(threads.get_run(owned_run(threads, caller, run_id)), shown_to(caller))

    @router.post("/runs/{run_id}/cancel", response_model=RunOut, tags=["runs"], responses=not_found)
    def cancel_run(run_id: RunId, caller: Caller = Depends(caller_of)) -> RunOut:
        """Abort a run that has not ended; one that has is returned as it is."""
        stored = owned_run(threads, caller, run_id)
        return RunOut.of(threads.cancel(stored, reason="cancelled through the HTTP API"), shown_to(caller))

    @router.get("/threads/{thread_id}/messages", response_model=list[MessageOut], tags=["threads"], responses=not_found)
    def thread_messages(
        thread_id: ThreadId,
        after: Annotated[int, Query(ge=-1, le=MAX_SEQ)] = -1,
        include_superseded: Annotated[
            bool, Query(description="Also the messages branches left behind (their superseded_by is set).")
        ] = False,
        caller: Caller = Depends(caller_of),
    ) -> list[MessageOut]:
        """The thread's messages in order, those with ``seq`` greater than ``after``: its current branch."""
        stored = owned_thread(threads, caller, thread_id)  # 404 for a thread that does not exist or is not the caller's
        found = threads.messages(stored, after=after, include_superseded=include_superseded)
        return [MessageOut.of(m, shown_to(caller)) for m in found]

    @router.get(
        "/threads/{thread_id}/events",
        tags=["threads"],
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "A text/event-stream of the thread's events: replay after the cursor, then live.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            400: {"model": ErrorOut, "description": "The cursor is not a sequence number of this thread."},
            **not_found,
        },
    )
    async def thread_events(
        thread_id: ThreadId,
        after: Annotated[
            int | None, Query(ge=0, le=MAX_SEQ, description="Resume after this seq (Last-Event-ID wins).")
        ] = None,
        last_event_id: Annotated[str | None, Header(description="The id of the last frame seen.")] = None,
        caller: Caller = Depends(caller_of),
    ) -> StreamingResponse:
        """Server-Sent Events: the thread's event log after the cursor, then tailed live.

        Frames are ``id: <seq>``, ``event: <type>``, ``data: <json>``; a comment line comes
        every ~15 s of silence to keep proxies from closing the connection.
        """
        cursor = parse_cursor(last_event_id, after)
        stored = await run_in_threadpool(owned_thread, threads, caller, thread_id)
        last = await run_in_threadpool(last_event_seq, threads, stored)
        if cursor > last:
            raise ApiError(
                400, "cursor_out_of_range",
                f"cursor {cursor} is beyond the last event of thread {thread_id} ({last}); resume from an id you received",
            )  # fmt: skip
        return StreamingResponse(
            event_stream(
                threads,
                stored,
                cursor,
                keepalive_s=keepalive_s,
                poll_interval_s=poll_interval_s,
                shown=shown_to(caller),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.get("/parked", response_model=list[PendingCallOut], tags=["calls"])
    def parked(caller: Caller = Depends(caller_of)) -> list[PendingCallOut]:
        """The caller's calls that wait for a person: parked after an interruption, or awaiting approval."""
        return [PendingCallOut.of(c, shown_to(caller)) for c in threads.parked(tenant=caller.tenant)]

    @router.get("/runs/{run_id}/pending", response_model=list[PendingCallOut], tags=["calls"], responses=not_found)
    def run_pending(run_id: RunId, caller: Caller = Depends(caller_of)) -> list[PendingCallOut]:
        """What waits for a person under a run: its own calls, then its child runs' (kind "child")."""
        stored = owned_run(threads, caller, run_id)
        return [PendingCallOut.of(c, shown_to(caller)) for c in threads.pending(stored)]

    # Decisions are recorded under the token's principal; a principal in the body is ignored.
    @router.post(
        "/calls/{effect_key}/approve", response_model=Decision, tags=["calls"], responses={**not_found, **conflict}
    )
    def approve(effect_key: EffectKey, body: Approve, caller: Caller = Depends(caller_of)) -> Decision:
        """Approve a call awaiting approval, for its arguments or for edited (re-validated) ones."""
        stored = owned_call(threads, caller, effect_key)
        threads.approve(stored, principal=caller.principal, override_args=body.override_args, remember=body.remember)
        return Decision(effect_key=effect_key, decision="approved")

    @router.post(
        "/calls/{effect_key}/deny", response_model=Decision, tags=["calls"], responses={**not_found, **conflict}
    )
    def deny(effect_key: EffectKey, body: Deny, caller: Caller = Depends(caller_of)) -> Decision:
        """Deny a call awaiting approval; the model sees ``denied: <reason>`` and goes on."""
        threads.deny(owned_call(threads, caller, effect_key), body.reason, principal=caller.principal)
        return Decision(effect_key=effect_key, decision="denied")

    @router.post(
        "/calls/{effect_key}/resolve", response_model=Decision, tags=["calls"], responses={**not_found, **conflict}
    )
    def resolve(effect_key: EffectKey, body: Resolve, caller: Caller = Depends(caller_of)) -> Decision:
        """Settle a parked call: assume_done records ``result``; assume_not_done runs it again."""
        stored = owned_call(threads, caller, effect_key)
        threads.resolve(stored, body.resolution, principal=caller.principal, result=body.result)
        return Decision(effect_key=effect_key, decision=body.resolution)

    @router.get("/calls/{effect_key}/result", response_model=CallResultOut, tags=["calls"], responses=not_found)
    def call_result(effect_key: EffectKey, caller: Caller = Depends(caller_of)) -> CallResultOut:
        """A tool call's whole result, also when the model was shown it shortened."""
        stored = owned_call(threads, caller, effect_key)
        with threads.store.read() as tx:
            found = tx.tool_result(stored)
        if found is None:
            raise CallNotFound(effect_key)
        status, shown, whole, is_error = found
        return CallResultOut(
            effect_key=effect_key,
            status=status,
            is_error=is_error,
            result=whole if whole is not None else shown,
            shortened_for_model=whole is not None,
        )

    add_agent_tool_routes(
        router,
        threads,
        caller_of=caller_of,
        stream=lambda thread_id, cursor, shown: event_stream(
            threads, thread_id, cursor, keepalive_s=keepalive_s, poll_interval_s=poll_interval_s, shown=shown
        ),
    )
    add_usage_routes(router, threads, caller_of=caller_of)
    add_branch_routes(router, threads, caller_of=caller_of)
    add_deploy_routes(router, threads, caller_of=caller_of)
    add_history_routes(router, threads, caller_of=caller_of, environ=os.environ if environ is None else environ)
    for add_chat_routes in (add_vercel_ai_routes, add_ag_ui_routes):
        add_chat_routes(router, threads, caller_of=caller_of, keepalive_s=keepalive_s)
    return router


# -- for uvicorn and the CLI -------------------------------------------------------------------


def app_from_environment(*, embedded: bool = False) -> FastAPI:
    """The API for ``threads-celery api`` or ``uvicorn --factory threads_celery.api.app:app_from_environment``.

    The runtime comes from ``THREADS_DATABASE_URL`` and ``THREADS_BROKER_URL``; with neither set
    it is refused (``ConfigError``) unless ``embedded`` asks for the embedded SQLite store and its
    in-process worker. A database is used as it is, never migrated here: one that is not at the
    latest migration is refused, as worker and Beat refuse it. The agents of ``THREADS_AGENTS``
    are loaded so that approvals with edited arguments can be validated against the tool's schema;
    embedded, its in-process worker starts with them, so that the runs a decision continues go on.
    What start-up made is then left out of later garbage collections (:func:`settle_heap`).
    """
    env = os.environ
    # Refuse a misconfigured API before opening any connection.
    check_auth_config(auth_from_env(env), set(callers_from_env(env)))
    check_secret_key()
    max_body_from_env(env)
    settings = Settings.from_env()
    if not (embedded or settings.database_url or settings.broker_url):
        raise ConfigError(
            "THREADS_DATABASE_URL and THREADS_BROKER_URL are not set: set them to serve your "
            "deployment, or pass --embedded to serve the embedded SQLite store"
        )
    if embedded and (settings.database_url or settings.broker_url):
        raise ConfigError(
            "--embedded serves the embedded SQLite store, but THREADS_DATABASE_URL or THREADS_BROKER_URL is set"
        )
    threads = Threads(settings=settings, migrate=None if settings.database_url is None else False)
    try:
        if not threads.is_embedded:
            check_database(threads.store)
        agents = threads.registry.load(settings.agents) if settings.agents else []
        check_models(agents)
        for agent in agents:
            threads.register(agent)
        if threads.is_embedded and agents:
            # This process is the only worker of its store: a call approved here (or a variable
            # set, a park resolved) runs here at once, also in runs that another command started.
            threads.start_worker()
        app = create_api(threads, env=env, close_threads_on_shutdown=True)
    except BaseException:
        threads.close()
        raise
    settle_heap()
    return app


__all__ = ["app_from_environment", "create_api", "settle_heap", "v1_routes"]
