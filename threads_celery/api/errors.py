"""The HTTP API's error answers: one JSON shape for every failure, never a trace or a secret.

Every error is ``{"error": {"type": ..., "message": ...}}``. A library exception maps to a status
by its class (:data:`ERROR_STATUS`); :class:`ApiError` is an answer the API decides on itself;
FastAPI's own HTTP and validation errors are reshaped; anything else is a logged 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from threads_celery.api.bodies import ErrorOut
from threads_celery.api.tenancy import shown_to
from threads_celery.exceptions import (
    BranchPointNotFound,
    BrokerUnavailable,
    CallNotFound,
    CallStateError,
    ConfigError,
    HistoryRefused,
    InvalidArguments,
    ModelUnavailable,
    PayloadTooLarge,
    RunNotFound,
    StoreUnavailable,
    ThreadBusy,
    ThreadNotFound,
    ThreadsError,
    UnknownAgent,
)

log = logging.getLogger("threads_celery.api.errors")

# A library error, by class (the first match along the MRO wins): status and error type.
ERROR_STATUS: dict[type[ThreadsError], tuple[int, str]] = {
    UnknownAgent: (404, "unknown_agent"),
    RunNotFound: (404, "run_not_found"),
    ThreadNotFound: (404, "thread_not_found"),
    CallNotFound: (404, "call_not_found"),
    CallStateError: (409, "call_state_conflict"),
    ThreadBusy: (409, "thread_busy"),
    BranchPointNotFound: (404, "message_not_found"),
    # Export or erasure of a thread that is running, has a call without an outcome, or is held.
    HistoryRefused: (409, "history_refused"),
    InvalidArguments: (422, "invalid_arguments"),
    PayloadTooLarge: (413, "payload_too_large"),
    StoreUnavailable: (503, "store_unavailable"),
    BrokerUnavailable: (503, "broker_unavailable"),
    # At request time a ConfigError is a clash with the ledger's state, e.g. a thread_id that
    # belongs to another agent (the API checks the schema when it starts).
    ConfigError: (409, "conflict"),
    # The agent's model cannot run where the run would: its provider package is not installed.
    ModelUnavailable: (409, "model_unavailable"),
}
# These say which service is down in the log, and only that it is down to the client.
TERSE_ERRORS = (StoreUnavailable, BrokerUnavailable)
HTTP_ERROR_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        401: "Missing or wrong bearer token.",
        422: "The request does not fit the schema.",
        503: "The database or broker is unavailable.",
    }.items()
}


class ApiError(Exception):
    """An error answer the API decided on itself (not a library exception)."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type, message


def error_response(
    status: int, type: str, message: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body: dict[str, Any] = {"type": type, "message": message}
    body.update({k: v for k, v in extra.items() if v is not None})
    return JSONResponse({"error": body}, status_code=status, headers=dict(headers or {}))


def _shown(request: Request, message: str) -> str:
    """The message with the ids it names in the caller's own form (a library error names stored ids)."""
    caller = getattr(request.state, "caller", None)
    return shown_to(caller)(message) if caller is not None else message


async def library_error(request: Request, exc: ThreadsError) -> JSONResponse:
    """A library exception, by its class (:data:`ERROR_STATUS`); an unmapped one is a logged 500."""
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            status, kind = ERROR_STATUS[cls]
            break
    else:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(500, "internal_error", "internal server error")
    if isinstance(exc, TERSE_ERRORS):
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error_response(status, kind, (type(exc).__doc__ or kind).strip())
    return error_response(status, kind, _shown(request, exc.message or kind))


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.type, _shown(request, exc.message))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else kind
    return error_response(exc.status_code, kind, message, headers=exc.headers)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Never echo the input back: a rejected body may hold a secret.
    details = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
    if any(d["type"] == "json_invalid" for d in details):
        first = next(e for e in exc.errors() if e.get("type") == "json_invalid")
        reason = (first.get("ctx") or {}).get("error", "malformed JSON")
        message = f"the body is not valid JSON: {reason} (at position {first.get('loc', ('', '?'))[-1]})"
    else:
        message = "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in details[:5]) or "invalid request"
    return error_response(422, "validation_error", message, details=details)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(500, "internal_error", "internal server error")


async def api_answer(request: Request, exc: Exception) -> JSONResponse | None:
    """The API's own answer to ``exc`` (a library error, an :class:`ApiError`, an HTTP or
    validation error), or None for anything else. For routes that answer their errors
    themselves, in an app whose handlers are not the API's (threads_celery.api.router)."""
    if isinstance(exc, ThreadsError):
        return await library_error(request, exc)
    if isinstance(exc, ApiError):
        return await api_error(request, exc)
    if isinstance(exc, RequestValidationError):
        return await validation_error(request, exc)
    if isinstance(exc, StarletteHTTPException):
        return await http_error(request, exc)
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of ``app`` in the error shape."""
    app.add_exception_handler(ThreadsError, library_error)  # type: ignore[arg-type]  # Starlette types handlers by Exception
    app.add_exception_handler(ApiError, api_error)  # type: ignore[arg-type]  # as above
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]  # as above
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]  # as above
    app.add_exception_handler(Exception, unexpected_error)


__all__ = ["ERROR_RESPONSES", "ERROR_STATUS", "ApiError", "api_answer", "error_response", "install_error_handlers"]
