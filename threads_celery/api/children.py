"""HTTP routes for a thread's agent-tool runs and variables: list, clear, drill in, set env.

Drill-in is gated by the parent's registry: a run id that the parent thread never started is a
404, and nothing is spawned for it. Every route first checks that the thread belongs to the
caller's tenant (a child thread belongs to its parent's), so another tenant's thread is a 404 too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from threads_celery.api.bodies import EFFECT_KEY_PATTERN, ID_PATTERN, MAX_SEQ, ErrorOut, Shown, as_stored
from threads_celery.api.errors import ApiError
from threads_celery.api.events import last_event_seq, parse_cursor
from threads_celery.api.tenancy import Caller, owned_thread, shown_to

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.records import AgentToolRun

AgentToolRunId = Annotated[str, Path(pattern=EFFECT_KEY_PATTERN, description="An agent-tool run id.")]
#: The statuses an agent-tool run can have (``threads_celery.records.AGENT_TOOL_STATUSES``).
AgentToolStatus = Literal["starting", "running", "completed", "error", "aborted", "interrupted"]
ThreadId = Annotated[str, Path(pattern=ID_PATTERN, description="A thread id.")]


class MilestoneOut(BaseModel):
    sequence: int
    name: str
    data: Any = None
    at: datetime | None = None


class AgentToolRunOut(BaseModel):
    """One agent-tool run as the parent's registry keeps it."""

    run_id: str
    agent_type: str
    status: str
    display_name: str | None
    display_order: int
    parent_tool_call_id: str | None
    detached: bool
    reason: str | None
    child_still_running: bool | None
    summary: str | None
    error: str | None
    progress: dict[str, Any] | None
    milestones: list[MilestoneOut]
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, row: AgentToolRun, shown: Shown = as_stored) -> AgentToolRunOut:
        return cls(
            run_id=shown(row.run_id),
            agent_type=row.agent_type,
            status=row.status,
            display_name=row.display_name,
            display_order=row.display_order,
            parent_tool_call_id=row.parent_tool_call_id,
            detached=row.detached,
            reason=shown(row.reason) if row.reason is not None else None,
            child_still_running=row.child_still_running,
            summary=row.summary,
            error=shown(row.error) if row.error is not None else None,
            progress=row.progress,
            milestones=[MilestoneOut(sequence=m.sequence, name=m.name, data=m.data, at=m.at) for m in row.milestones],
            started_at=row.started_at,
            finished_at=row.finished_at,
        )


class Cleared(BaseModel):
    cleared: int


class SetEnv(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = Field(max_length=65536)


class EnvSet(BaseModel):
    name: str
    resumed_calls: int


def add_agent_tool_routes(
    router: APIRouter,
    threads: Threads,
    *,
    caller_of: Callable[..., Caller],
    stream: Callable[[str, int, Shown], AsyncIterator[str]],
) -> None:
    """Register the routes on the /v1 router; ``stream(thread_id, cursor, shown)`` is the app's event stream."""
    # FastAPI's own type for extra OpenAPI responses.
    not_found: dict[int | str, dict[str, Any]] = {
        404: {"model": ErrorOut, "description": "No such thread, or no such run in its registry."}
    }

    def registry_row(caller: Caller, thread_id: str, stored_thread: str, run_id: str) -> AgentToolRun:
        # The run is named as the caller sees it (its id can hold the caller's scoped run id
        # inside, agent-tool:acme~order-1:0:0): found among the thread's own runs by that name.
        shown = shown_to(caller)
        for candidate in threads.agent_tool_runs(stored_thread):
            if shown(candidate.run_id) == run_id:
                row = threads.inspect_agent_tool_run(candidate.run_id)
                if row is not None and row.parent_thread_id == stored_thread:
                    return row
        raise ApiError(404, "not_found", f"thread {thread_id} has no agent-tool run {run_id}")

    @router.get(
        "/threads/{thread_id}/agent-tool-runs",
        response_model=list[AgentToolRunOut],
        tags=["agent tools"],
        responses=not_found,
    )
    def list_agent_tool_runs(
        thread_id: ThreadId,
        status: Annotated[list[AgentToolStatus] | None, Query()] = None,
        caller: Caller = Depends(caller_of),
    ) -> list[AgentToolRunOut]:
        """The thread's retained agent-tool runs, oldest first, with progress and milestones."""
        stored = owned_thread(threads, caller, thread_id)  # 404 for a thread that does not exist or is not the caller's
        rows = threads.agent_tool_runs(stored, status=status)
        return [AgentToolRunOut.of(threads.inspect_agent_tool_run(r.run_id) or r, shown_to(caller)) for r in rows]

    @router.delete(
        "/threads/{thread_id}/agent-tool-runs", response_model=Cleared, tags=["agent tools"], responses=not_found
    )
    def clear_agent_tool_runs(
        thread_id: ThreadId,
        status: Annotated[list[AgentToolStatus] | None, Query()] = None,
        older_than: Annotated[
            AwareDatetime | None, Query(description="Only runs started before this instant (with its UTC offset).")
        ] = None,
        caller: Caller = Depends(caller_of),
    ) -> Cleared:
        """Delete retained runs and their child threads; running ones are cancelled first."""
        stored = owned_thread(threads, caller, thread_id)
        return Cleared(cleared=threads.clear_agent_tool_runs(stored, status=status, older_than=older_than))

    @router.get(
        "/threads/{thread_id}/agent-tool-runs/{run_id}/events",
        tags=["agent tools"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}, **not_found},
    )
    async def drill_in(
        thread_id: ThreadId,
        run_id: AgentToolRunId,
        after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
        caller: Caller = Depends(caller_of),
    ) -> StreamingResponse:
        """The child's own event stream, only for a run the parent's registry holds."""
        stored = await run_in_threadpool(owned_thread, threads, caller, thread_id)
        row = await run_in_threadpool(registry_row, caller, thread_id, stored, run_id)
        if row.child_thread_id is None:
            raise ApiError(404, "not_found", f"agent-tool run {run_id} has no child thread yet")
        cursor = parse_cursor(last_event_id, after)
        last = await run_in_threadpool(last_event_seq, threads, row.child_thread_id)
        if cursor > last:
            raise ApiError(400, "cursor_out_of_range", f"cursor {cursor} is beyond the child's last event ({last})")
        return StreamingResponse(
            stream(row.child_thread_id, cursor, shown_to(caller)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    @router.post("/threads/{thread_id}/env", response_model=EnvSet, tags=["threads"], responses=not_found)
    def set_env(thread_id: ThreadId, body: SetEnv, caller: Caller = Depends(caller_of)) -> EnvSet:
        """Give the thread a variable's value (secrets are encrypted); waiting runs go on."""
        stored = owned_thread(threads, caller, thread_id)
        resumed = threads.set_env(stored, body.name, body.value, principal=caller.principal)
        return EnvSet(name=body.name, resumed_calls=resumed)
