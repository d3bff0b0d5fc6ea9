"""What the chat protocols share besides the parts of a reply (:mod:`~threads_celery.api.chat_parts`).

The Vercel AI SDK's UI message stream (:mod:`~threads_celery.api.chat_vercel`) and AG-UI
(:mod:`~threads_celery.api.chat_agui`) both show one agent run as an assistant reply. Here: which
run a chat request streams (:func:`latest_run`, :func:`check_agent`, :func:`start_run`,
:func:`run_in_progress`), where its events begin (:func:`first_event_seq`,
:func:`last_status_seq`), the approvals a request answers (:func:`answer_approvals`), the feed of
a reply from the thread's live events (:func:`reply_stream`, :func:`reply_frames`), and what
their routes document alike (:data:`AgentName`, :func:`error_responses`,
:func:`event_stream_response`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Path
from starlette.concurrency import run_in_threadpool

from threads_celery.api.bodies import ID_PATTERN, ErrorOut, Shown
from threads_celery.api.chat_parts import ENDED, Part, ReplyParts
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller, owned_call, run_to_start
from threads_celery.exceptions import CallNotFound, CallStateError
from threads_celery.live import events as live
from threads_celery.records import Event, Run

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

log = logging.getLogger("threads_celery.api.chat")

EVENT_BATCH = 500
_ID = re.compile(ID_PATTERN)

AgentName = Annotated[str, Path(pattern=ID_PATTERN, description="The agent's name.")]
#: Headers of a reply stream: no cache, and no proxy holding the frames back.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE_FRAME = ": keepalive\n\n"


def error_responses(not_found: str) -> dict[int | str, dict[str, object]]:
    """The error answers a chat route documents; ``not_found`` says what its 404 covers."""
    return {
        404: {"model": ErrorOut, "description": not_found},
        409: {"model": ErrorOut, "description": "The thread belongs to another agent."},
        413: {"model": ErrorOut, "description": "The body is over the size limit."},
    }


def event_stream_response(description: str) -> dict[int | str, dict[str, object]]:
    """The ``200`` answer a chat route documents: ``text/event-stream`` described by ``description``."""
    return {200: {"description": description, "content": {"text/event-stream": {"schema": {"type": "string"}}}}}


def is_id(value: str) -> bool:
    """Whether a client's id (a chat, thread or message id) can name a thread or run (``ID_PATTERN``)."""
    return _ID.fullmatch(value) is not None


def reply_parts(threads: Threads, run_id: str, shown: Shown, *, from_start: bool = False) -> ReplyParts:
    """A :class:`ReplyParts` for ``run_id`` reading what it needs from ``threads``.

    ``from_start``: it will be fed the run's events from the start, so it learns its calls' effect
    keys as they come; otherwise they are read from the run's messages first.
    """

    def resolution_of(effect_key: str) -> str | None:
        with threads.store.read() as tx:
            found = tx.get_call_and_run(effect_key)
        return None if found is None else found[0].resolution

    parts = ReplyParts(run_id=run_id, shown=shown, pending=threads.pending, resolution_of=resolution_of)
    if from_start:
        return parts
    # A reply that goes on after an approval names calls it did not show: know their effect keys.
    with threads.store.read() as tx:
        run = tx.get_run(run_id)
    if run is not None:
        for message in threads.messages(run.thread_id):
            if message.run_id == run_id:
                parts._effect_keys.update({c.id: c.effect_key for c in message.tool_calls if c.effect_key})
    return parts


# -- which run a request streams -----------------------------------------------------------------


def first_event_seq(threads: Threads, thread_id: str, run_id: str) -> int:
    """The seq just before the run's first event in its thread's log (its replay starts after it)."""
    cursor = 0
    while True:
        with threads.store.read() as tx:
            batch = tx.list_events(thread_id, after=cursor)
        for event in batch:
            if event.run_id == run_id:
                return event.seq - 1
            cursor = event.seq
        if not batch:
            return cursor


def last_status_seq(threads: Threads, thread_id: str, run_id: str, status: str) -> int:
    """The seq of the run's last ``run`` event with ``status``; 0 if there is none."""
    found, cursor = 0, 0
    while True:
        with threads.store.read() as tx:
            batch = list(islice(tx.list_events(thread_id, after=cursor), EVENT_BATCH))
        for event in batch:
            if event.run_id == run_id and event.type == "run" and event.payload.get("status") == status:
                found = event.seq
            cursor = event.seq
        if not batch:
            return found


def latest_run(threads: Threads, thread_id: str) -> Run | None:
    """The thread's newest run, if it has one."""
    found = threads.runs(thread_id=thread_id, limit=1)
    return found[0] if found else None


def check_agent(threads: Threads, agent: str, run: Run | None) -> None:
    """404 for an agent the ledger does not know; 409 for a thread of another agent."""
    with threads.store.read() as tx:
        known = tx.agent_hash(agent) is not None
    if not known:
        raise ApiError(404, "unknown_agent", f"agent {agent!r} is not registered")
    if run is not None and run.agent != agent:
        raise ApiError(409, "conflict", f"thread {run.thread_id} belongs to agent {run.agent!r}, not {agent!r}")


def start_run(
    threads: Threads, caller: Caller, agent: str, thread_id: str, text: str, message_id: str
) -> tuple[str, str, int]:
    """Start a run on the thread with the user's message: its thread, its run and the cursor to stream after.

    The message's id, when it can name a run, is the run's id: the same message sent again attaches
    to the run it started. 422 for a message with no text.
    """
    if not text.strip():
        raise ApiError(422, "validation_error", "messages: the last user message has no text")
    run_id = run_to_start(threads, caller, message_id) if is_id(message_id) else None
    handle = threads.start(agent, text, thread_id=thread_id, run_id=run_id, tenant=caller.tenant)
    return handle.thread_id, handle.run_id, first_event_seq(threads, handle.thread_id, handle.run_id)


def run_in_progress(threads: Threads, thread_id: str, latest: Run | None) -> tuple[str, str | None, int]:
    """The thread's run in progress and the cursor before its first event; no run (None, 0) if it has ended."""
    if latest is None or latest.status in ENDED:
        return thread_id, None, 0
    return thread_id, latest.id, first_event_seq(threads, thread_id, latest.id)


@dataclass(frozen=True, slots=True)
class Answer:
    """One person's answer to an approval, as a protocol's request carries it."""

    approval_id: str
    approved: bool
    reason: str | None = None
    override_args: dict[str, Any] | None = None


def answer_approvals(threads: Threads, caller: Caller, thread_id: str, answers: list[Answer]) -> tuple[str, int]:
    """Record each answer under the caller's principal; the run answered and where its reply goes on.

    Every answer is checked before any is recorded: an approval of another tenant or another
    thread is 404, as on ``/v1``, and changes nothing. An answer to a call decided already (the
    client sent its history again) is skipped: deciding is not repeated. The reply goes on after
    the run's last ``awaiting_approval`` event, read before the answers are recorded.
    """
    if not answers:
        raise ValueError("no answer to record")
    found = []
    for answer in answers:
        key = owned_call(threads, caller, answer.approval_id)
        with threads.store.read() as tx:
            row = tx.get_call_and_run(key)
        if row is None or row[1].thread_id != thread_id:
            raise CallNotFound(answer.approval_id)
        found.append((answer, key, row[0].status, row[1].id))
    run_id = found[-1][3]
    cursor = last_status_seq(threads, thread_id, run_id, "awaiting_approval")
    for answer, key, status, _ in found:
        if status != "awaiting_approval":
            continue
        try:
            if answer.approved:
                threads.approve(key, principal=caller.principal, override_args=answer.override_args)
            else:
                threads.deny(key, answer.reason or "denied by the user", principal=caller.principal)
        except CallStateError:
            continue  # decided meanwhile by another request: that decision stands
    return run_id, cursor


# -- the feed of a reply ---------------------------------------------------------------------------


async def reply_stream(
    threads: Threads,
    thread_id: str,
    parts: ReplyParts,
    cursor: int,
    *,
    keepalive_s: float,
) -> AsyncIterator[list[Part] | None]:
    """The reply's parts from the thread's live events after ``cursor``; ``None`` for a keepalive.

    The committed events and the deltas of the step in progress come merged from
    ``threads.live_events``; the deltas are shown as they come and the committed message
    completes them. Ends after the reply's :class:`RunEnd`, which leaves the subscription.
    """
    feed = _Feed(threads, thread_id, parts, cursor)
    async with threads.live_events(thread_id, after=cursor, heartbeat_s=keepalive_s) as events:
        async for event in events:
            if isinstance(event, live.Heartbeat):
                yield None
                continue
            out = await feed.parts_of(event)
            if out:
                yield out
            if parts.done:
                return


async def reply_frames(
    threads: Threads,
    thread_id: str,
    parts: ReplyParts,
    cursor: int,
    frames_of: Callable[[Part], str],
    *,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The SSE text of :func:`reply_stream`: each batch of parts as ``frames_of`` encodes them, and keepalives."""
    async for batch in reply_stream(threads, thread_id, parts, cursor, keepalive_s=keepalive_s):
        if batch is None:
            yield KEEPALIVE_FRAME
            continue
        yield "".join(frames_of(part) for part in batch)


def _step_of(effect_key: object) -> int | None:
    """The step of an effect key ``<run id>:<step>:<index>``; None for anything else."""
    parts = effect_key.rsplit(":", 2) if isinstance(effect_key, str) else []
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() and len(parts[1]) < 10 else None


@dataclass
class _Feed:
    """Live events in order for one reply: a step's first delta comes after what committed before it.

    Deltas travel faster than the store is read, so the next model step's first delta can arrive
    before the previous step's tool results are read, though they were committed before it began.
    At each new step's first delta the store is read up to date first; committed events already
    fed are then skipped when the subscription delivers them.
    """

    threads: Threads
    thread_id: str
    parts: ReplyParts
    cursor: int
    step: tuple[int, int] | None = None
    #: Steps whose message is committed (a late delta of theirs is dropped); None: every step.
    _done_steps: set[int] | None = field(default_factory=set)

    def _committed_up_to_date(self) -> list[Part]:
        out: list[Part] = []
        while not self.parts.done:
            with self.threads.store.read() as tx:
                batch = tx.list_events(self.thread_id, after=self.cursor)
            if not batch:
                break
            for event in batch:
                out += self._committed(event)
                if self.parts.done:
                    break
        return out

    def _committed(self, event: Event) -> list[Part]:
        if event.seq <= self.cursor:
            return []  # fed already, when a step's first delta brought the store up to date
        self.cursor = event.seq
        payload = event.payload
        if event.type == "message" and event.run_id == self.parts.run_id and payload.get("role") == "assistant":
            # The step's message: its deltas are over. Its calls' effect keys (<run>:<step>:<i>) name
            # the step; a message with no call ends the run, and every step with it.
            keys = [c.get("effect_key") for c in payload.get("tool_calls") or [] if isinstance(c, dict)]
            steps = {step for k in keys if (step := _step_of(k)) is not None}
            if not steps:
                self._done_steps = None
            elif self._done_steps is not None:
                self._done_steps |= steps
        return self.parts.committed(event)

    def _step_is_done(self, step: int) -> bool:
        return self._done_steps is None or step in self._done_steps

    async def parts_of(self, event: live.LiveEvent) -> list[Part]:
        parts = self.parts
        match event:
            case live.Committed(event=committed):
                return await run_in_threadpool(self._committed, committed)
            case live.TextDelta() | live.ThinkingDelta() | live.ToolCallDelta() if event.run_id == parts.run_id:
                out: list[Part] = []
                if (event.step, event.attempt) != self.step:
                    self.step = (event.step, event.attempt)
                    out = await run_in_threadpool(self._committed_up_to_date)
                    if parts.done:
                        return out
                if self._step_is_done(event.step):
                    return out  # a step whose message is committed: the message showed it whole
                if not parts.fresh(event.step, event.attempt, event.seq):
                    return out  # sent already (a replay after a resync or of the step in progress)
                if isinstance(event, live.TextDelta):
                    return out + parts.text_delta(event.text)
                if isinstance(event, live.ThinkingDelta):
                    return out + parts.reasoning_delta(event.text)
                return out + parts.tool_args_delta(event.call_id, event.name, event.args)
            case live.StepVoid() if event.run_id == parts.run_id:
                return parts.void(event.step, event.attempt)
            case live.Resync():
                parts.resynced()
        return []


__all__ = [
    "KEEPALIVE_FRAME",
    "SSE_HEADERS",
    "AgentName",
    "Answer",
    "answer_approvals",
    "check_agent",
    "error_responses",
    "event_stream_response",
    "first_event_seq",
    "is_id",
    "last_status_seq",
    "latest_run",
    "reply_frames",
    "reply_parts",
    "reply_stream",
    "run_in_progress",
    "start_run",
]
