"""Regenerate and edit from the chat protocols: which run a request branches from, and the
history of the thread's current branch.

A chat's user message is one run's input; its id in the client is the run's id, or, for a run
that a regenerate or an edit started, the id the client gave the message it replaced (kept in
the run's ``input_meta``), so the client's ids hold across a reload. A regenerate or an edit
branches the thread in place, just before that run's user message
(:meth:`~threads_celery.client.branches.BranchesMixin.regenerate`,
:meth:`~threads_celery.client.branches.BranchesMixin.edit`); what followed is kept as a
superseded branch, and the history shows the current branch only. The server's history is the
truth: a regenerate answers the message as the ledger holds it, not as the request repeats it.
A thread with a run in progress is refused (409 ``thread_busy``): the client cancels it first
(``POST /v1/runs/{id}/cancel``) or waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from threads_celery.api.chat_common import first_event_seq
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller, owned_run, run_to_start
from threads_celery.exceptions import RunNotFound
from threads_celery.records import BranchKind, Run
from threads_celery.transitions.runs import new_id

if TYPE_CHECKING:
    from threads_celery.api.bodies import Shown
    from threads_celery.client.threads import Threads

#: The key of a run's ``input_meta`` holding the client's id of its user message.
MESSAGE_ID_KEY = "message_id"
#: The key holding the AG-UI ``runId`` of the request that started the run by branching.
CLIENT_RUN_KEY = "client_run_id"
REPLY_PREFIX = "reply-"


def current_runs(threads: Threads, thread_id: str) -> list[Run]:
    """The thread's runs on its current branch (a run whose user message a branch left behind is
    not), oldest first."""
    with threads.store.read() as tx:
        left = tx.superseded_run_ids(thread_id)
    found = threads.runs(thread_id=thread_id, limit=10_000)
    return [r for r in reversed(found) if r.id not in left]


def message_id_of(run: Run, shown: Shown) -> str:
    """The client's id of the run's user message."""
    given = (run.input_meta or {}).get(MESSAGE_ID_KEY)
    return given if isinstance(given, str) else shown(run.id)


def run_of_message(runs: list[Run], message_id: str, shown: Shown) -> Run | None:
    """The run of ``runs`` whose user message the client calls ``message_id`` (or whose reply
    it calls ``reply-<run>``)."""
    wanted = message_id.removeprefix(REPLY_PREFIX)
    for run in runs:
        if wanted in (message_id_of(run, shown), shown(run.id)):
            return run
    return None


def branch_and_stream(
    threads: Threads,
    caller: Caller,
    thread_id: str,
    run: Run,
    text: str | None,
    kind: BranchKind,
    shown: Shown,
    *,
    client_run_id: str | None = None,
) -> tuple[str, str, int]:
    """Branch the thread just before ``run``'s user message, start the new run (``text``, or the
    same message again), and where its reply streams from."""
    handle = threads._branch_and_start(
        thread_id,
        run.id,
        text,
        kind,
        by=caller.principal,
        input_meta={
            MESSAGE_ID_KEY: message_id_of(run, shown),
            **({CLIENT_RUN_KEY: client_run_id} if client_run_id is not None else {}),
        },
        new_run_id=run_to_start(threads, caller, new_id("run")),
    )
    return handle.thread_id, handle.run_id, first_event_seq(threads, handle.thread_id, handle.run_id)


def superseded(threads: Threads, caller: Caller, thread_id: str, message_id: str) -> bool:
    """Whether the client's message names a run of the thread that a branch left behind."""
    try:
        run_id = owned_run(threads, caller, message_id)
    except RunNotFound:
        return False
    with threads.store.read() as tx:
        return run_id in tx.superseded_run_ids(thread_id)


def stale(message_id: str) -> ApiError:
    return ApiError(
        409,
        "stale_branch",
        f"message {message_id!r} is on a branch of the chat that was regenerated or edited; reload the chat",
    )


__all__ = [
    "CLIENT_RUN_KEY",
    "MESSAGE_ID_KEY",
    "branch_and_stream",
    "current_runs",
    "message_id_of",
    "run_of_message",
    "stale",
    "superseded",
]
