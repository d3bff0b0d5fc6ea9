"""The ``/v1`` routes as a router for the app's own FastAPI app, behind the app's own authentication.

::

    from threads_celery.api import api_router

    app.include_router(api_router(threads, caller=current_caller), prefix="/agents")

The routes are those of :func:`~threads_celery.api.app.create_api` (``/agents/v1/runs``, the SSE
event stream, the chat protocols...), each asking ``caller`` (a FastAPI dependency answering a
:class:`~threads_celery.api.tenancy.Caller`, see :func:`~threads_celery.api.auth.caller_dependency`).

The app's exception handlers are the app's own, and a router brings none (FastAPI has no
handlers per router). So each route answers its errors itself (:class:`ApiRoute`): library
errors, the API's own refusals, FastAPI's validation errors and any ``HTTPException`` raised
while serving it (the caller dependency's 401 or 403 included) become the API's documented error
bodies (``{"error": {"type": ..., "message": ...}}``) before the app's handlers could see them,
and the request body is held to the API's limit (413) as it streams in. Anything else (a bug)
goes on to the app's own handling, as any of its routes' would. Paths no route matches are the
app's business (its 404 and 405).

To serve the API as an app of its own under a path instead, mount it:
``app.mount("/agents", create_api(threads, caller=current_caller))``.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any, ClassVar

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute, APIRouter

from threads_celery.api.app import v1_routes
from threads_celery.api.auth import caller_dependency
from threads_celery.api.body_limit import DEFAULT_MAX_BODY_BYTES, max_body_from_env
from threads_celery.api.errors import api_answer, error_response
from threads_celery.api.events import DEFAULT_KEEPALIVE_S, DEFAULT_POLL_INTERVAL_S
from threads_celery.client.threads import Threads
from threads_celery.exceptions import ConfigError


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"the request body is over the limit of {limit} bytes")


class ApiRoute(APIRoute):
    """A route that answers its own errors in the API's shape and holds its body to a limit.

    FastAPI calls the handler this builds for each request (its dependencies, body parsing and
    validation happen inside it), so what it raises is answered here, in the API's error shape,
    whatever handlers the app around it has. A body over :attr:`max_body_bytes` (by its
    Content-Length, or as it streams in) is a 413.
    """

    #: The request body limit; :func:`api_router` makes a subclass with its own.
    max_body_bytes: ClassVar[int] = DEFAULT_MAX_BODY_BYTES

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        limit = self.max_body_bytes

        async def answered(request: Request) -> Response:
            limited = Request(request.scope, _limited_receive(request.receive, limit))
            try:
                declared = request.headers.get("content-length")
                if declared is not None and not (declared.isascii() and declared.isdigit()):
                    return error_response(400, "bad_request", "Content-Length is not a number")
                if declared is not None and int(declared) > limit:
                    raise _too_large(limit)
                return await handler(limited)
            except Exception as exc:
                answer = await api_answer(limited, exc)
                if answer is None:
                    raise  # a bug: the app's own error handling (and its reporting) sees it
                return answer

        return answered


def _limited_receive(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]], limit: int
) -> Callable[[], Awaitable[MutableMapping[str, Any]]]:
    """``receive``, raising a 413 once more than ``limit`` bytes of body have arrived."""
    received = 0

    async def limited() -> MutableMapping[str, Any]:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                # FastAPI passes an HTTPException raised while reading the body on unchanged.
                raise _too_large(limit)
        return message

    return limited


def api_router(
    threads: Threads,
    *,
    caller: Callable[..., Any],
    max_body_bytes: int | None = None,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
) -> APIRouter:
    """An ``APIRouter`` with the API's ``/v1`` routes on ``threads``, for ``app.include_router``.

    ``caller`` is the app's own authentication, as a FastAPI dependency answering the request's
    :class:`~threads_celery.api.tenancy.Caller` (principal and tenant) or raising
    ``HTTPException``; it is required (a router in someone's app has no tokens of its own).
    Errors keep the API's documented bodies in any app (:class:`ApiRoute`), and request bodies
    are limited to ``max_body_bytes`` (default: ``THREADS_API_MAX_BODY_BYTES``, else 1 MiB). ``/healthz``, ``/readyz`` and the
    console are not in it: mount the console with
    :func:`~threads_celery.api.console.create_console` (``caller=`` too).
    """
    if not isinstance(threads, Threads):
        raise TypeError(f"api_router takes a Threads runtime, not {type(threads).__name__}")
    if max_body_bytes is None:
        max_body_bytes = max_body_from_env(os.environ)
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
        raise ConfigError(f"max_body_bytes must be a positive integer, not {max_body_bytes!r}")
    caller_of = caller_dependency(caller)
    route_class = type("ApiRoute", (ApiRoute,), {"max_body_bytes": max_body_bytes})
    return v1_routes(
        threads, caller_of, keepalive_s=keepalive_s, poll_interval_s=poll_interval_s, route_class=route_class
    )


__all__ = ["ApiRoute", "api_router"]
