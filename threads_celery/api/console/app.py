"""The console as an ASGI app of its own: pages, sign-in, and the answers to errors.

:func:`create_console` builds it; ``threads-celery api`` mounts it at ``/console`` (unless
``THREADS_CONSOLE=0``), and a user's own FastAPI app mounts it the same way::

    app.mount("/console", create_console(threads, tokens=["alice@acme=tok_a1"]))
    app.mount("/console", create_console(threads, caller=staff_member))  # the app's own auth

With ``caller=`` (a FastAPI dependency answering a :class:`~threads_celery.api.tenancy.Caller`)
every page asks the app's own authentication and there is no sign-in page: what the dependency
refuses (``HTTPException`` 401, 403) is a console page with that status and its headers (so a
``WWW-Authenticate: Basic`` still makes the browser ask).

Pages are rendered on the server (Jinja2, autoescaped: nothing a model, a tool or a user wrote is
ever markup) and work without JavaScript; ``static/console.js`` only makes them live (the run's
event stream, the status counts). Every response forbids inline script and framing
(Content-Security-Policy), so even a value that escaped escaping could not run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from threads_celery.api.auth import auth_from_env, caller_dependency, callers_from_env
from threads_celery.api.console import backbone, inbox, runs
from threads_celery.api.console.pages import (
    HERE,
    MAX_FORM_BYTES,
    SECURITY_HEADERS,
    Console,
    FormRefused,
    NotFound,
    SignInRequired,
    base_of,
    same_origin,
)
from threads_celery.api.console.session import COOKIE, DEFAULT_SESSION_S, Session, caller_of_token, issue
from threads_celery.api.tenancy import Caller, callers_from_tokens
from threads_celery.exceptions import BrokerUnavailable, CallNotFound, RunNotFound, StoreUnavailable, ThreadNotFound

log = logging.getLogger("threads_celery.api.console")


def create_console(
    threads: Any,
    *,
    caller: Callable[..., Any] | None = None,
    tokens: Iterable[str] | Mapping[str, Caller] | None = None,
    auth: bool | None = None,
    session_s: float = DEFAULT_SESSION_S,
    env: Mapping[str, str] | None = None,
) -> FastAPI:
    """The console app for ``threads`` (a :class:`~threads_celery.client.threads.Threads`).

    ``tokens`` and ``auth`` default to ``THREADS_API_TOKENS`` and ``THREADS_API_AUTH``, and mean
    what they mean for ``/v1``: a person signs in with one of the tokens and sees its tenant only.
    ``caller`` replaces them with the app's own authentication, as for
    :func:`~threads_celery.api.app.create_api`: every page asks it, and nothing signs in here.
    """
    env = os.environ if env is None else env
    if caller is not None and (tokens is not None or auth is not None):
        raise TypeError("create_console: pass caller= or tokens=/auth=, not both (caller= replaces the tokens)")
    dependencies = []
    if caller is not None:
        caller_of = caller_dependency(caller)
        # Forms' CSRF tokens are keyed by THREADS_SECRET_KEY when it is set, so that every API
        # process behind one address accepts the forms the others served.
        secret = env.get("THREADS_SECRET_KEY")
        console = Console(threads, {}, auth=True, session_s=session_s, asks_the_app=True, csrf_secret=secret)

        async def session_of(request: Request, found: Caller = Depends(caller_of)) -> None:
            request.state.console_session = console.session_of_caller(found)

        dependencies.append(Depends(session_of))
    else:
        auth = auth_from_env(env) if auth is None else auth
        callers = callers_from_env(env) if tokens is None else callers_from_tokens(tokens)
        console = Console(threads, callers, auth=auth, session_s=session_s)
    # Every page asks the app's dependency first (when there is one): no route can forget it.
    app = FastAPI(
        title="threads-celery console", docs_url=None, redoc_url=None, openapi_url=None, dependencies=dependencies
    )
    app.state.console = console
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(SignInRequired)
    async def to_sign_in(request: Request, _: Exception) -> Response:
        if not console.signs_in:
            return console.render(request, "error.html", 401, message="not signed in")
        response = RedirectResponse(f"{base_of(request)}/sign-in", status_code=303)
        response.delete_cookie(COOKIE, path=f"{base_of(request)}/")
        return response

    @app.exception_handler(NotFound)
    @app.exception_handler(RunNotFound)
    @app.exception_handler(ThreadNotFound)
    @app.exception_handler(CallNotFound)
    async def not_found(request: Request, exc: Exception) -> Response:
        what = exc.what if isinstance(exc, NotFound) else "run, thread or call with this id"
        return console.render(request, "not_found.html", 404, session=_session_or_none(console, request), what=what)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, _: Exception) -> Response:
        # A path or query that is no id of anything (e.g. /runs/<script>): the page of a missing one.
        session = _session_or_none(console, request)
        if session is None and console.auth:
            return await to_sign_in(request, SignInRequired())
        return console.render(request, "not_found.html", 404, session=session, what="such page")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # The app's dependency refusing (401, 403, with its WWW-Authenticate), or no such route.
        session = _session_or_none(console, request)
        if exc.status_code == 404:
            return console.render(request, "not_found.html", 404, session=session, what="such page")
        message = exc.detail if isinstance(exc.detail, str) and exc.detail else "refused"
        response = console.render(request, "error.html", exc.status_code, session=session, message=message)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(FormRefused)
    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, FormRefused)
        return console.render(
            request, "error.html", exc.status, session=_session_or_none(console, request), message=exc.message
        )

    # Anything else is Starlette's plain 500 (no debug page): never a stack trace or a URL.
    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(BrokerUnavailable)
    async def failed(request: Request, exc: Exception) -> Response:
        log.warning("console: %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return console.render(
            request,
            "error.html",
            503,
            session=_session_or_none(console, request),
            message="the store or the broker is unavailable; try again",
        )

    @app.get("/sign-in", response_class=HTMLResponse, include_in_schema=False)
    def sign_in_page(request: Request) -> Response:
        if not console.signs_in:
            return RedirectResponse(f"{base_of(request)}/", status_code=303)
        return console.render(request, "sign_in.html")

    @app.post("/sign-in", response_class=HTMLResponse, include_in_schema=False)
    async def sign_in(request: Request) -> Response:
        if not console.signs_in:
            return RedirectResponse(f"{base_of(request)}/", status_code=303)
        if not same_origin(request):  # no signing a browser in to someone else's session
            return console.render(request, "sign_in.html", 403, error="sign in from this page")
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return console.render(request, "sign_in.html", 413, error="that is not a token")
        token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[-1].strip()
        known = caller_of_token(token, console.callers) if token else None
        if known is None:
            return console.render(request, "sign_in.html", 401, error="that token is not valid here")
        response = RedirectResponse(f"{base_of(request)}/", status_code=303)
        response.set_cookie(
            COOKIE,
            issue(known),
            max_age=int(console.session_s),
            path=f"{base_of(request)}/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @app.post("/sign-out", include_in_schema=False)
    async def sign_out(request: Request) -> Response:
        session = console.session(request)
        await console.form(request, session)
        response = RedirectResponse(f"{base_of(request)}/sign-in", status_code=303)
        response.delete_cookie(COOKIE, path=f"{base_of(request)}/")
        return response

    runs.add_routes(app, console)
    inbox.add_routes(app, console)
    backbone.add_routes(app, console)
    return app


def _session_or_none(console: Console, request: Request) -> Session | None:
    try:
        return console.session(request)
    except SignInRequired:
        return None


__all__ = ["create_console"]
