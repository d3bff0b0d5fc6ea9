"""The HTTP API's branch routes: a thread's history rewound, forked, regenerated and edited.

- ``GET /v1/threads/{id}/branches``: the thread's branches, oldest first;
- ``POST /v1/threads/{id}/rewind`` ``{"at": seq}``: go on from message ``at`` in place (what
  followed is kept as a superseded branch); 204 when nothing follows it;
- ``POST /v1/threads/{id}/fork`` ``{"at": seq, "thread_id": ..., "inherit_grants": false}``: a
  new thread (201) whose history is a copy through ``at``;
- ``POST /v1/threads/{id}/regenerate`` ``{"run_id": ...}`` and ``POST /v1/threads/{id}/edit``
  ``{"run_id": ..., "text": ...}``: answer a user message again, or a new text in its place,
  as a new run (201).

``GET /v1/threads/{id}/messages?include_superseded=true`` shows what branches left behind.
Branching in place is refused while a run of the thread is in progress (409 ``thread_busy``);
a point that is not a message of the current branch is 404 ``message_not_found``. The rules are
:mod:`threads_celery.transitions.branches`'.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, Field

from threads_celery.api.bodies import ID_PATTERN, MAX_SEQ, ErrorOut, RunOut, Text, _Request
from threads_celery.api.tenancy import Caller, owned_run, owned_thread, shown_to, thread_to_start
from threads_celery.records import Branch

if TYPE_CHECKING:
    from threads_celery.api.bodies import Shown
    from threads_celery.client.threads import Threads

ThreadId = Annotated[str, Path(pattern=ID_PATTERN, description="A thread id.")]
Seq = Annotated[int | None, Field(ge=0, le=MAX_SEQ, description="The seq of the last message kept; null: none.")]


class PriorEffectOut(BaseModel):
    effect_key: str
    tool: str
    effect: str
    status: str


class BranchOut(BaseModel):
    """One branch of a thread's history."""

    id: int
    thread_id: str
    kind: str
    from_seq: int | None
    source_thread_id: str | None
    source_seq: int | None
    prior_effects: list[PriorEffectOut]
    dropped_calls: list[str]
    inherit_grants: bool
    created_by: str | None
    created_at: datetime

    @classmethod
    def of(cls, branch: Branch, shown: Shown) -> BranchOut:
        return cls(
            id=branch.id,
            thread_id=shown(branch.thread_id),
            kind=branch.kind,
            from_seq=branch.from_seq,
            source_thread_id=shown(branch.source_thread_id) if branch.source_thread_id else None,
            source_seq=branch.source_seq,
            prior_effects=[
                PriorEffectOut(effect_key=shown(p.effect_key), tool=p.tool, effect=p.effect, status=p.status)
                for p in branch.prior_effects
            ],
            dropped_calls=[shown(k) for k in branch.dropped_calls],
            inherit_grants=branch.inherit_grants,
            created_by=branch.created_by,
            created_at=branch.created_at,
        )


class Rewind(_Request):
    """Go on from message ``at``, in place."""

    at: Seq


class Fork(_Request):
    """A new thread whose history is a copy through message ``at``."""

    at: Seq
    thread_id: Annotated[str | None, Field(pattern=ID_PATTERN, description="The new thread's id (default: new).")] = (
        None
    )
    inherit_grants: bool = False


class Regenerate(_Request):
    """Answer a user message again; by default the thread's latest on its current branch."""

    run_id: Annotated[str | None, Field(pattern=ID_PATTERN, description="The run whose reply is replaced.")] = None


class Edit(_Request):
    """Put ``text`` in place of the user message of ``run_id`` and answer it."""

    run_id: Annotated[str, Field(pattern=ID_PATTERN, description="The run whose user message is replaced.")]
    text: Annotated[Text, Field(min_length=1, description="The new user message.")]


def add_branch_routes(router: APIRouter, threads: Threads, *, caller_of: Callable[..., Caller]) -> None:
    """The branch routes, on ``router`` (``/v1``)."""
    errors: dict[int | str, dict[str, object]] = {
        404: {"model": ErrorOut, "description": "No such thread, run or message (or not the caller's)."},
        409: {"model": ErrorOut, "description": "A run of the thread is in progress (thread_busy)."},
    }

    @router.get("/threads/{thread_id}/branches", response_model=list[BranchOut], tags=["threads"], responses=errors)
    def list_branches(thread_id: ThreadId, caller: Caller = Depends(caller_of)) -> list[BranchOut]:
        """The thread's branches, oldest first."""
        stored = owned_thread(threads, caller, thread_id)
        return [BranchOut.of(b, shown_to(caller)) for b in threads.branches(stored)]

    @router.post(
        "/threads/{thread_id}/rewind",
        response_model=BranchOut,
        tags=["threads"],
        responses={**errors, 204: {"description": "Nothing follows the point: nothing changed."}},
    )
    def rewind(thread_id: ThreadId, body: Rewind, caller: Caller = Depends(caller_of)) -> BranchOut | Response:
        """Go on from message ``at`` in place; what followed is kept as a superseded branch."""
        stored = owned_thread(threads, caller, thread_id)
        branch = threads.rewind(stored, body.at, by=caller.principal)
        if branch is None:
            return Response(status_code=204)
        return BranchOut.of(branch, shown_to(caller))

    @router.post(
        "/threads/{thread_id}/fork", response_model=BranchOut, status_code=201, tags=["threads"], responses=errors
    )
    def fork(thread_id: ThreadId, body: Fork, caller: Caller = Depends(caller_of)) -> BranchOut:
        """A new thread of the caller's whose history is a copy of this one's through ``at``."""
        stored = owned_thread(threads, caller, thread_id)
        new = thread_to_start(threads, caller, body.thread_id) if body.thread_id is not None else None
        branch = threads.fork(
            stored, body.at, new_thread_id=new, inherit_grants=body.inherit_grants, by=caller.principal
        )
        return BranchOut.of(branch, shown_to(caller))

    @router.post(
        "/threads/{thread_id}/regenerate", response_model=RunOut, status_code=201, tags=["threads"], responses=errors
    )
    def regenerate(thread_id: ThreadId, body: Regenerate, caller: Caller = Depends(caller_of)) -> RunOut:
        """Answer a user message again, as a new run; the old reply is kept as a superseded branch."""
        stored = owned_thread(threads, caller, thread_id)
        run_id = owned_run(threads, caller, body.run_id) if body.run_id is not None else None
        handle = threads.regenerate(stored, run_id, by=caller.principal)
        return RunOut.of(threads.get_run(handle.run_id), shown_to(caller))

    @router.post(
        "/threads/{thread_id}/edit", response_model=RunOut, status_code=201, tags=["threads"], responses=errors
    )
    def edit(thread_id: ThreadId, body: Edit, caller: Caller = Depends(caller_of)) -> RunOut:
        """Put a new text in place of a user message and answer it, as a new run."""
        stored = owned_thread(threads, caller, thread_id)
        handle = threads.edit(stored, owned_run(threads, caller, body.run_id), body.text, by=caller.principal)
        return RunOut.of(threads.get_run(handle.run_id), shown_to(caller))


__all__ = ["BranchOut", "add_branch_routes"]
