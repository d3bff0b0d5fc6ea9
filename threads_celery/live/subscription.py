"""A thread's live events, merged: its committed events and the deltas of the step in progress.

:func:`live_events` is what the SSE endpoint, ``threads.stream`` and the protocol adapters
iterate. On entry (and after a ``resync``) it subscribes first, then reads the committed events
after the cursor, then the step in progress from the replay buffer, then goes live; a delta seen
twice (buffered and live) is sent once (by its seq). Committed events are read when the worker
nudges the thread's channel after a commit, and every :data:`FALLBACK_POLL_S` in case a nudge
was lost: a stream no longer polls the store four times a second.

Per subscriber it keeps which attempt of each step it is forwarding: when a later attempt of a
step it streamed begins (its worker died, the step was retried), it sends :class:`StepVoid` for
the earlier one before the new attempt's deltas. A step whose stream ended, or was voided, gets
no more deltas. Leaving the context (or cancelling the task iterating it) unsubscribes: nothing
is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from threads_celery.exceptions import StoreUnavailable, ThreadNotFound
from threads_celery.live.events import Committed, Heartbeat, LiveEvent, Resync, StepVoid
from threads_celery.live.hub import LiveHub, Subscriber
from threads_celery.live.wire import BusMessage
from threads_celery.records import TERMINAL_STATUSES, Event

if TYPE_CHECKING:
    from threads_celery.store import Store

log = logging.getLogger("threads_celery.live.subscription")

#: How often committed events are read without a nudge.
FALLBACK_POLL_S = 3.0
EVENT_BATCH = 500


class StepTracker:
    """Which deltas a subscriber forwards: one attempt per step, each seq once, none after the end."""

    def __init__(self) -> None:
        self.attempts: dict[tuple[str, int], int] = {}
        self.seen: dict[tuple[str, int, int], int] = {}
        #: (run, step) -> the last attempt that ended or was voided: its deltas are done.
        self.done: dict[tuple[str, int], int] = {}
        self.open: dict[str, tuple[int, int]] = {}

    def on_message(self, message: BusMessage) -> list[LiveEvent]:
        key = (message.run_id, message.step)
        if self.done.get(key, -1) >= message.attempt and not message.void:
            return []
        out: list[LiveEvent] = []
        current = self.attempts.get(key)
        if current is not None and message.attempt < current:
            return []
        if current is not None and message.attempt > current:
            out.append(StepVoid(message.run_id, message.step, current))
            self._close(key, current)
            current = None
        if message.void or message.ended:
            if message.void and current is not None:
                out.append(StepVoid(message.run_id, message.step, message.attempt))
            self.done[key] = max(self.done.get(key, -1), message.attempt)
            if current is not None:
                self._close(key, current)
            return out
        self.attempts[key] = message.attempt
        self.open[message.run_id] = key[1], message.attempt
        seen_key = (message.run_id, message.step, message.attempt)
        deltas = message.deltas(self.seen.get(seen_key, 0))
        if deltas:
            self.seen[seen_key] = deltas[-1].seq
            out.extend(deltas)
        return out

    def on_committed(self, event: Event) -> None:
        """A run's assistant message, or its end, closes the step it was streaming."""
        run_id = event.run_id
        if run_id is None or run_id not in self.open:
            return
        if event.type == "message" and event.payload.get("role") == "assistant":
            pass
        elif not (event.type == "run" and event.payload.get("status") in TERMINAL_STATUSES):
            return
        step, attempt = self.open[run_id]
        self.done[(run_id, step)] = max(self.done.get((run_id, step), -1), attempt)
        self._close((run_id, step), attempt)

    def _close(self, key: tuple[str, int], attempt: int) -> None:
        self.attempts.pop(key, None)
        self.seen.pop((key[0], key[1], attempt), None)
        if self.open.get(key[0]) == (key[1], attempt):
            del self.open[key[0]]
        if len(self.done) > 256:  # keep the last steps' ends only
            for stale in list(self.done)[:128]:
                del self.done[stale]


def _read_committed(store: Store, thread_id: str, after: int) -> list[Event]:
    with store.read() as tx:
        return tx.list_events(thread_id, after=after, limit=EVENT_BATCH)


def _thread_exists(store: Store, thread_id: str) -> bool:
    with store.read() as tx:
        return tx.get_thread(thread_id) is not None


async def _committed(
    store: Store, thread_id: str, cursor: int, tracker: StepTracker, out: list[LiveEvent | Heartbeat]
) -> int:
    """Add the committed events after ``cursor`` (a batch of them) to ``out``; the new cursor."""
    try:
        batch = await asyncio.to_thread(_read_committed, store, thread_id, cursor)
    except StoreUnavailable as exc:
        log.warning("live events of %s: %s", thread_id, exc)
        return cursor
    for event in batch:
        cursor = event.seq
        tracker.on_committed(event)
        out.append(Committed(event))
    return cursor


@contextlib.asynccontextmanager
async def live_events(
    store: Store,
    hub: LiveHub,
    thread_id: str,
    *,
    after: int = 0,
    heartbeat_s: float | None = None,
    fallback_poll_s: float = FALLBACK_POLL_S,
) -> AsyncIterator[AsyncIterator[LiveEvent | Heartbeat]]:
    """The thread's live events after committed seq ``after`` (see the module's docstring).

    ``thread_id`` is the stored id; the caller has checked the caller's tenant. Raises
    :class:`~threads_celery.exceptions.ThreadNotFound` for a thread that does not exist. With
    ``heartbeat_s``, a :class:`~threads_celery.live.events.Heartbeat` comes after that much silence.
    """
    if not await asyncio.to_thread(_thread_exists, store, thread_id):
        raise ThreadNotFound(thread_id)
    loop = asyncio.get_running_loop()
    subscriber = await asyncio.to_thread(hub.subscribe, thread_id, loop)
    try:
        yield _each(_iterate(store, hub, subscriber, thread_id, after, heartbeat_s, fallback_poll_s))
    finally:
        hub.unsubscribe(subscriber)


@contextlib.asynccontextmanager
async def live_event_batches(
    store: Store,
    hub: LiveHub,
    thread_id: str,
    *,
    after: int = 0,
    heartbeat_s: float | None = None,
    fallback_poll_s: float = FALLBACK_POLL_S,
) -> AsyncIterator[AsyncIterator[list[LiveEvent | Heartbeat]]]:
    """:func:`live_events` in batches: the events that were there at each wake-up, together."""
    if not await asyncio.to_thread(_thread_exists, store, thread_id):
        raise ThreadNotFound(thread_id)
    subscriber = await asyncio.to_thread(hub.subscribe, thread_id, asyncio.get_running_loop())
    try:
        yield _iterate(store, hub, subscriber, thread_id, after, heartbeat_s, fallback_poll_s)
    finally:
        hub.unsubscribe(subscriber)


async def _each(batches: AsyncIterator[list[LiveEvent | Heartbeat]]) -> AsyncIterator[LiveEvent | Heartbeat]:
    async for batch in batches:
        for event in batch:
            yield event


async def _iterate(
    store: Store,
    hub: LiveHub,
    subscriber: Subscriber,
    thread_id: str,
    cursor: int,
    heartbeat_s: float | None,
    fallback_poll_s: float,
) -> AsyncIterator[list[LiveEvent | Heartbeat]]:
    """The events in batches: what was there at each wake-up (the SSE endpoint writes a batch at once)."""
    tracker = StepTracker()
    replay = True
    read_committed = True
    next_poll = time.monotonic() + fallback_poll_s
    quiet_since = time.monotonic()
    while True:
        if subscriber.overflowed:
            subscriber.overflowed = False
            subscriber.take()
            tracker = StepTracker()
            yield [Resync(after=cursor)]
            replay = read_committed = True
        out: list[LiveEvent | Heartbeat] = []
        if replay:
            # The committed events first, then the step in progress from its start, then the
            # committed events again: a step's stream ends before its message commits, so its
            # message comes after its deltas whenever it commits in between.
            replay = False
            cursor = await _committed(store, thread_id, cursor, tracker, out)
            for message in await asyncio.to_thread(hub.replay, subscriber.channel):
                out.extend(tracker.on_message(message))
            read_committed = True
        # Live deltas before committed events, for the same reason.
        for message in subscriber.take():
            out.extend(tracker.on_message(message))
        if subscriber.nudged:
            subscriber.nudged = False
            read_committed = True
        if read_committed or time.monotonic() >= next_poll:
            next_poll = time.monotonic() + fallback_poll_s
            before = len(out)
            cursor = await _committed(store, thread_id, cursor, tracker, out)
            read_committed = len(out) - before >= EVENT_BATCH
        if out:
            yield out
            quiet_since = time.monotonic()
        elif heartbeat_s is not None and time.monotonic() - quiet_since >= heartbeat_s:
            quiet_since = time.monotonic()
            yield [Heartbeat()]
        if read_committed or subscriber.messages or subscriber.overflowed or subscriber.nudged:
            continue
        wait = next_poll - time.monotonic()
        if heartbeat_s is not None:
            wait = min(wait, heartbeat_s - (time.monotonic() - quiet_since))
        subscriber.wake.clear()
        if subscriber.messages or subscriber.nudged or subscriber.overflowed:
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(subscriber.wake.wait(), max(wait, 0.0))


__all__ = ["FALLBACK_POLL_S", "StepTracker", "live_event_batches", "live_events"]
