"""``GET /v1/threads/{thread_id}/export`` and ``DELETE /v1/threads/{thread_id}``: a caller's own
thread exported as JSON Lines, or erased with the report of what went.

Off unless ``THREADS_API_HISTORY`` is true: exporting is a read of everything a thread holds, and
erasing cannot be undone, so a deployment turns them on knowing that every token of a tenant may
then do both to that tenant's threads (and only to those: another tenant's thread answers 404,
as everywhere in the API). The answers show ids as the caller chose them (its scope taken out,
as every answer does). A thread that is running, or has a call whose effect has no outcome,
or is held (erasure), is a 409 naming why, and nothing changes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Path, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRouter

from threads_celery.api.bodies import ID_PATTERN, ErrorOut
from threads_celery.api.tenancy import Caller, owned_thread, shown_to
from threads_celery.client.threads import Threads

HISTORY_VARIABLE = "THREADS_API_HISTORY"
_TRUE = ("1", "true", "yes", "on")


def history_routes_enabled(environ: Mapping[str, str]) -> bool:
    """Whether ``THREADS_API_HISTORY`` turns the history routes on."""
    return environ.get(HISTORY_VARIABLE, "").strip().lower() in _TRUE


def add_history_routes(
    router: APIRouter, threads: Threads, *, caller_of: Callable[..., Any], environ: Mapping[str, str]
) -> None:
    """Add the two routes to ``router`` when ``environ`` turns them on (``THREADS_API_HISTORY``)."""
    if not history_routes_enabled(environ):
        return
    refused: dict[int | str, dict[str, Any]] = {
        404: {"model": ErrorOut, "description": "No such thread."},
        409: {"model": ErrorOut, "description": "The thread is running, has a call without an outcome, or is held."},
    }

    @router.get(
        "/threads/{thread_id}/export",
        tags=["history"],
        responses={**refused, 200: {"content": {"application/x-ndjson": {}}, "description": "JSON Lines"}},
        response_class=Response,
    )
    def export_thread(
        thread_id: Annotated[str, Path(pattern=ID_PATTERN)], caller: Caller = Depends(caller_of)
    ) -> Response:
        """The thread with its child threads as JSON Lines (format version 1: a header line, one
        line per row, an end line; secrets' values are never in it)."""
        stored = owned_thread(threads, caller, thread_id)
        buffer = io.StringIO()
        threads.export(buffer, thread_id=stored)
        return Response(shown_to(caller)(buffer.getvalue()), media_type="application/x-ndjson")

    @router.delete("/threads/{thread_id}", tags=["history"], responses=refused)
    def erase_thread(
        thread_id: Annotated[str, Path(pattern=ID_PATTERN)], caller: Caller = Depends(caller_of)
    ) -> JSONResponse:
        """Erase the thread with its child threads: every row of theirs and their files. Answers
        the erasure's report (the threads, the rows per table, the files, when)."""
        stored = owned_thread(threads, caller, thread_id)
        report = threads.erase(thread_id=stored)
        return JSONResponse(json.loads(shown_to(caller)(json.dumps(report.as_dict()))))


__all__ = ["HISTORY_VARIABLE", "add_history_routes", "history_routes_enabled"]
