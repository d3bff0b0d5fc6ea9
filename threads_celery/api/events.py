"""A thread's events as Server-Sent Events: the log replayed after a cursor, then tailed live,
with the deltas of the model step in progress (:mod:`threads_celery.live`) in the same stream.

Each committed frame has ``id: <seq>``, ``event: <type>`` and ``data: <json>``; a delta frame
(``text_delta``, ``thinking_delta``, ``tool_call_delta``) or stream control (``step_void``,
``resync``) has no ``id:`` line (see docs/streaming.md). Sequence numbers are
allocated under the thread's row lock and committed in that order, so a client that resumes from
the last id it saw (``Last-Event-ID``, else ``?after=``) misses nothing and sees nothing twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from threads_celery.api.bodies import MAX_SEQ, EventOut, Shown, as_stored
from threads_celery.api.errors import ApiError
from threads_celery.exceptions import ThreadNotFound
from threads_celery.live.events import Committed, Heartbeat, LiveEvent
from threads_celery.live.subscription import FALLBACK_POLL_S, live_event_batches
from threads_celery.records import Event

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

log = logging.getLogger("threads_celery.api.events")

DEFAULT_KEEPALIVE_S = 15.0
#: How often a stream reads the store without a nudge (a worker nudges after each commit).
DEFAULT_POLL_INTERVAL_S = FALLBACK_POLL_S


def parse_cursor(last_event_id: str | None, after: int | None) -> int:
    """The seq to resume after: ``Last-Event-ID`` wins over ``?after=``; 400 for a malformed id."""
    if last_event_id is not None and last_event_id.strip():
        raw = last_event_id.strip()
        # ASCII digits only (str.isdigit also takes other scripts' digits), and no more than a
        # sequence number can be: int() of thousands of digits is refused by Python itself.
        if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(MAX_SEQ)) or int(raw) > MAX_SEQ:
            raise ApiError(
                400, "invalid_cursor", "Last-Event-ID must be the id (a sequence number) of a frame you received"
            )
        return int(raw)
    return after or 0


def last_event_seq(threads: Threads, thread_id: str) -> int:
    """The thread's last event sequence number; ThreadNotFound if there is no such thread."""
    with threads.store.read() as tx:
        thread = tx.get_thread(thread_id)
    if thread is None:
        raise ThreadNotFound(thread_id)
    return int(thread.event_seq or 0)


def sse_frame(event: Event, shown: Shown = as_stored) -> str:
    """One SSE frame, its ids as ``shown``. JSON has no raw newline, so ``data`` is a single line."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {EventOut.of(event, shown).model_dump_json()}\n\n"


def live_frame(event: LiveEvent | Heartbeat, shown: Shown = as_stored) -> str:
    """One SSE frame of a live event: a committed event as :func:`sse_frame` (``id: <seq>``), a
    delta or stream control with its own ``event:`` type and no ``id:`` (so that the client's
    ``Last-Event-ID`` stays the last committed seq), a heartbeat as a comment."""
    if isinstance(event, Committed):
        return sse_frame(event.event, shown)
    if isinstance(event, Heartbeat):
        return ": keepalive\n\n"
    data = event.to_json()
    if "run_id" in data:
        data["run_id"] = shown(data["run_id"])
    return f"event: {event.type}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def event_stream(
    threads: Threads,
    thread_id: str,
    cursor: int,
    *,
    keepalive_s: float,
    poll_interval_s: float,
    shown: Shown = as_stored,
) -> AsyncIterator[str]:
    """The stream's frames: the committed events after ``cursor`` and the step in progress from
    its start, then both live (:meth:`Threads.live_events`), with a comment line after
    ``keepalive_s`` of silence so that proxies keep the connection open. Committed events are
    read when the worker nudges the thread, and every ``poll_interval_s`` without one.
    ``thread_id`` is the stored id; the frames show ids as ``shown`` (the caller's own form)."""
    yield "retry: 3000\n\n"
    async with live_event_batches(
        threads.store,
        threads.live_hub,
        thread_id,
        after=cursor,
        heartbeat_s=keepalive_s,
        fallback_poll_s=poll_interval_s,
    ) as batches:
        async for batch in batches:  # one write for what arrived together
            yield "".join(live_frame(event, shown) for event in batch)


__all__ = ["event_stream", "last_event_seq", "live_frame", "parse_cursor", "sse_frame"]
