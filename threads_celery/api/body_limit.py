"""The HTTP API's request body limit (``THREADS_API_MAX_BODY_BYTES``, 1 MiB by default)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from threads_celery.api.errors import error_response
from threads_celery.exceptions import ConfigError

DEFAULT_MAX_BODY_BYTES = 1 << 20  # room for a message at the default 1,000,000-byte limit, in JSON


def max_body_from_env(env: Mapping[str, str]) -> int:
    raw = env.get("THREADS_API_MAX_BODY_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise ConfigError(f"THREADS_API_MAX_BODY_BYTES must be a positive integer, not {raw!r}")
    return int(raw)


# The ASGI interface's types, as BodyLimit sees them.
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyLimit:
    """413 for a request body over ``max_bytes``: by its Content-Length, or as it streams in.

    A pure ASGI middleware, so a chunked upload is cut off at the limit instead of being read
    into memory first.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> JSONResponse:
        return error_response(413, "payload_too_large", f"the request body is over the limit of {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await error_response(400, "bad_request", "Content-Length is not a number")(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await self._too_large()(scope, receive, send)
                return
        received = 0
        started = False

        async def limited_receive() -> MutableMapping[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI passes an HTTPException raised while reading the body on to the
                    # exception handlers, which answer in the usual error shape.
                    raise HTTPException(413, f"the request body is over the limit of {self.max_bytes} bytes")
            return message

        async def tracking_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except HTTPException as exc:
            if exc.status_code != 413 or started:
                raise
            await self._too_large()(scope, receive, send)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit", "max_body_from_env"]
