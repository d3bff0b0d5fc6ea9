"""A thread's events as Server-Sent Events: the log replayed after a cursor, then tailed live.

Each frame has ``id: <seq>``, ``event: <type>`` and ``data: <json>``. Sequence numbers are
allocated under the thread's row lock and committed in that order, so a client that resumes from
the last id it saw (``Last-Event-ID``, else ``?after=``) misses nothing and sees nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from itertools import islice
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from threads_celery.api.bodies import MAX_SEQ, EventOut, Shown, as_stored
from threads_celery.api.errors import ApiError
from threads_celery.exceptions import StoreUnavailable, ThreadNotFound
from threads_celery.records import Event

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

log = logging.getLogger("threads_celery.api.events")

DEFAULT_KEEPALIVE_S = 15.0
DEFAULT_POLL_INTERVAL_S = 0.25
EVENT_BATCH = 500


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


def _read_events(threads: Threads, thread_id: str, after: int) -> list[Event]:
    return list(islice(threads.events(thread_id, after=after), EVENT_BATCH))


def sse_frame(event: Event, shown: Shown = as_stored) -> str:
    """One SSE frame, its ids as ``shown``. JSON has no raw newline, so ``data`` is a single line."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {EventOut.of(event, shown).model_dump_json()}\n\n"


async def event_stream(
    threads: Threads,
    thread_id: str,
    cursor: int,
    *,
    keepalive_s: float,
    poll_interval_s: float,
    shown: Shown = as_stored,
) -> AsyncIterator[str]:
    """The stream's frames: replay after ``cursor``, then poll every ``poll_interval_s``, with a
    comment line after ``keepalive_s`` of silence so that proxies keep the connection open.
    ``thread_id`` is the stored id; the frames show ids as ``shown`` (the caller's own form)."""
    # Sequence numbers are allocated under the thread's row lock and committed in that order,
    # so "everything after the last seq sent" is exact: no gap to wait for, no duplicate.
    yield "retry: 3000\n\n"
    quiet_since = time.monotonic()
    while True:
        try:
            batch = await run_in_threadpool(_read_events, threads, thread_id, cursor)
        except StoreUnavailable as exc:
            log.warning("event stream of %s: %s", thread_id, exc)
            batch = []
            yield ": the store is unavailable; retrying\n\n"
            await asyncio.sleep(min(keepalive_s, 2.0))
        for event in batch:
            cursor = event.seq
            yield sse_frame(event, shown)
        if batch:
            quiet_since = time.monotonic()
            if len(batch) >= EVENT_BATCH:
                continue
        elif time.monotonic() - quiet_since >= keepalive_s:
            yield ": keepalive\n\n"
            quiet_since = time.monotonic()
        await asyncio.sleep(poll_interval_s)


__all__ = ["event_stream", "last_event_seq", "parse_cursor", "sse_frame"]
