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

The end of a step's stream becomes :class:`StepEnd` (with the attempt's last seq) and always
comes before the step's committed message: the worker publishes the end before it commits, but
the end travels over the broker and the message is read from the store, so a message read first
is held (with the committed events after it) until the end arrives. An end that has not arrived
:data:`END_WAIT_S` later was lost: the subscriber gets a :class:`Resync` (``incomplete``) before
the message instead. A subscriber that was streaming a step therefore gets, before its message,
either ``step_end``, ``step_void`` or ``resync``. A message read before anything of its step's
stream arrived goes out at once, and that stream, when it comes, is dropped up to its end: no
delta of a step comes after the step's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from threads_celery.exceptions import StoreUnavailable, ThreadNotFound
from threads_celery.live.events import Committed, Heartbeat, LiveEvent, Resync, StepEnd, StepVoid
from threads_celery.live.hub import LiveHub, Subscriber
from threads_celery.live.wire import BusMessage
from threads_celery.records import TERMINAL_STATUSES, Event

if TYPE_CHECKING:
    from threads_celery.store import Store

log = logging.getLogger("threads_celery.live.subscription")

#: How often committed events are read without a nudge.
FALLBACK_POLL_S = 3.0
EVENT_BATCH = 500
#: How long a step's committed message waits for the end of the step's stream, at most.
END_WAIT_S = 2.0


class StepTracker:
    """Which deltas a subscriber forwards: one attempt per step, each seq once, none after the end;
    and which committed messages must wait for the end of the step they close."""

    def __init__(self) -> None:
        self.attempts: dict[tuple[str, int], int] = {}
        self.seen: dict[tuple[str, int, int], int] = {}
        #: (run, step) -> the last attempt that ended or was voided: its deltas are done.
        self.done: dict[tuple[str, int], int] = {}
        #: run -> the (step, attempt) whose deltas it forwards, its end not come yet.
        self.open: dict[str, tuple[int, int]] = {}
        #: Runs whose replayed stream was dropped, its step having moved on (see close_step).
        self.closed_in_replay: set[str] = set()
        #: run -> the steps whose stream ended and whose message has not been read yet.
        self.ended: dict[str, set[int]] = {}
        #: The runs whose message was sent before anything of its step's stream came: the stream
        #: still on its way belongs to a step that is committed, and is dropped up to its end.
        self.orphaned: set[str] = set()
        #: The (run, step) streams dropped so.
        self.dropping: set[tuple[str, int]] = set()

    def on_message(self, message: BusMessage) -> list[LiveEvent]:
        """The events ``message`` makes (a step's end: :class:`StepEnd`, for the attempt this
        subscriber streamed)."""
        key = (message.run_id, message.step)
        if self.done.get(key, -1) >= message.attempt and not message.void:
            return []
        out: list[LiveEvent] = []
        current = self.attempts.get(key)
        if current is None and (key in self.dropping or message.run_id in self.orphaned):
            # The stream of a step whose message was sent already: nothing of it goes out.
            self.orphaned.discard(message.run_id)
            self.dropping.add(key)
            if len(self.dropping) > 256:  # streams whose end never came
                self.dropping.clear()
            if message.ended or message.void:
                self.dropping.discard(key)
                self.done[key] = max(self.done.get(key, -1), message.attempt)
            return []
        if current is not None and message.attempt < current:
            return []
        if current is not None and message.attempt > current:
            out.append(StepVoid(message.run_id, message.step, current))
            self._close(key, current)
            current = None
        if message.void:
            if current is not None:
                out.append(StepVoid(message.run_id, message.step, message.attempt))
                self._close(key, current)
            self.done[key] = max(self.done.get(key, -1), message.attempt)
            return out
        if message.ended:
            self.done[key] = max(self.done.get(key, -1), message.attempt)
            if current is not None:
                seen = self.seen.get((message.run_id, message.step, current), 0)
                last = message.end_seq if message.end_seq is not None else seen
                out.append(StepEnd(message.run_id, message.step, message.attempt, last))
                self._close(key, current)
                self._ended(key)
            return out
        self.attempts[key] = message.attempt
        self.open[message.run_id] = key[1], message.attempt
        self.closed_in_replay.discard(message.run_id)
        seen_key = (message.run_id, message.step, message.attempt)
        deltas = message.deltas(self.seen.get(seen_key, 0))
        if deltas:
            self.seen[seen_key] = deltas[-1].seq
            out.extend(deltas)
        return out

    def waits(self, event: Event) -> bool:
        """Whether ``event`` is the assistant message of a step whose deltas this subscriber
        forwards and whose end has not come: it must come after that end (which the worker
        published before it committed the message, but which may still be on its way here)."""
        run_id = event.run_id
        if run_id is None or run_id not in self.open or self.ended.get(run_id):
            return False
        return event.type == "message" and event.payload.get("role") == "assistant"

    def on_committed(self, event: Event, *, live: bool = True) -> None:
        """A run's assistant message is that of the earliest of its steps that ended, else it
        closes the step it was streaming, else (``live``: not while catching up on the thread's
        past) its step's stream has not come yet and will be dropped. The run's end closes its
        step too."""
        run_id = event.run_id
        if run_id is None:
            return
        if event.type == "message" and event.payload.get("role") == "assistant":
            steps = self.ended.get(run_id)
            if steps:  # the message of the earliest step that ended (not of one streaming now)
                steps.discard(min(steps))
                return
            if live and run_id not in self.open and run_id in self.closed_in_replay:
                # The message of the step the replay closed (committed between the replay's two
                # reads): its stream was dropped already, and the run's next one is not.
                self.closed_in_replay.discard(run_id)
            elif live and run_id not in self.open:
                self.orphaned.add(run_id)
                if len(self.orphaned) > 256:
                    self.orphaned.clear()
        elif event.type == "run" and event.payload.get("status") in TERMINAL_STATUSES:
            self.ended.pop(run_id, None)
        else:
            return
        if run_id not in self.open:
            return
        step, attempt = self.open[run_id]
        self.done[(run_id, step)] = max(self.done.get((run_id, step), -1), attempt)
        self._close((run_id, step), attempt)

    def close_step(self, run_id: str, step: int, attempt: int) -> None:
        """The step's message went out before any of its stream: none of it goes out now."""
        key = (run_id, step)
        self.done[key] = max(self.done.get(key, -1), attempt)
        current = self.attempts.get(key)
        if current is not None:
            self._close(key, current)
        self.closed_in_replay.add(run_id)
        if len(self.closed_in_replay) > 256:
            self.closed_in_replay.clear()

    def _ended(self, key: tuple[str, int]) -> None:
        """A step this subscriber streamed ended: its message is the run's next one to come."""
        steps = self.ended.setdefault(key[0], set())
        steps.add(key[1])
        if len(self.ended) > 256:  # runs whose messages never came (a lost commit): the oldest go
            for stale in list(self.ended)[:128]:
                del self.ended[stale]

    def _close(self, key: tuple[str, int], attempt: int) -> None:
        self.attempts.pop(key, None)
        self.seen.pop((key[0], key[1], attempt), None)
        if self.open.get(key[0]) == (key[1], attempt):
            del self.open[key[0]]
        if len(self.done) > 256:  # keep the last steps' ends only
            for stale in list(self.done)[:128]:
                del self.done[stale]


def _runs_steps(store: Store, run_ids: set[str]) -> dict[str, int]:
    with store.read() as tx:
        found = {run_id: tx.get_run(run_id) for run_id in run_ids}
    return {run_id: (sys.maxsize if run.is_terminal else run.step) for run_id, run in found.items() if run is not None}


async def _steps_moved_on(store: Store, run_ids: set[str]) -> dict[str, int]:
    """Each run's current step (past every step for an ended run): a replayed stream of an
    earlier step belongs to a step whose message is committed. Nothing while the store is away."""
    if not run_ids:
        return {}
    try:
        return await asyncio.to_thread(_runs_steps, store, run_ids)
    except StoreUnavailable as exc:
        log.warning("live events: reading the replayed runs' steps: %s", exc)
        return {}


def _read_committed(store: Store, thread_id: str, after: int) -> list[Event]:
    with store.read() as tx:
        return tx.list_events(thread_id, after=after, limit=EVENT_BATCH)


def _thread_exists(store: Store, thread_id: str) -> bool:
    with store.read() as tx:
        return tx.get_thread(thread_id) is not None


async def _read(store: Store, thread_id: str, after: int) -> list[Event]:
    """The committed events after ``after`` (a batch of them); none while the store is away."""
    try:
        return await asyncio.to_thread(_read_committed, store, thread_id, after)
    except StoreUnavailable as exc:
        log.warning("live events of %s: %s", thread_id, exc)
        return []


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
    #: Committed events read and not sent yet: the first waits for the end of its step's stream.
    held: deque[Event] = deque()
    held_until = 0.0
    #: The last committed seq read (``cursor`` is the last one sent).
    read_upto = cursor
    next_poll = time.monotonic() + fallback_poll_s
    quiet_since = time.monotonic()
    while True:
        if subscriber.overflowed:
            subscriber.overflowed = False
            subscriber.take()
            tracker = StepTracker()
            held.clear()
            read_upto = cursor
            yield [Resync(after=cursor, reason=subscriber.reason)]
            replay = read_committed = True
        out: list[LiveEvent | Heartbeat] = []
        if replay:
            # The committed events first, all of them (a batch per round; live messages are
            # dropped meanwhile: the replay has them), then the step in progress from its start,
            # then live, the committed events read again at once.
            subscriber.take()
            batch = await _read(store, thread_id, read_upto)
            held.extend(batch)
            read_upto = batch[-1].seq if batch else read_upto
            cursor = _release(held, tracker, cursor, out, forced=False, live=False)
            if len(batch) >= EVENT_BATCH:
                yield out
                continue
            replay = False
            replayed = await asyncio.to_thread(hub.replay, subscriber.channel)
            moved_on = await _steps_moved_on(store, {m.run_id for m in replayed if m.run_id})
            for message in replayed:
                if moved_on.get(message.run_id, -1) > message.step:
                    # Its message was committed before the replay's read (so it went out in the
                    # replay, ahead of this stream): the step is done for this subscriber.
                    tracker.close_step(message.run_id, message.step, message.attempt)
                    continue
                out.extend(tracker.on_message(message))
            read_committed = True
        # Live deltas before committed events: a step's end (published before its message was
        # committed) is taken before the message can be sent.
        for message in subscriber.take():
            out.extend(tracker.on_message(message))
        if subscriber.nudged:
            subscriber.nudged = False
            read_committed = True
        if not held and (read_committed or time.monotonic() >= next_poll):
            next_poll = time.monotonic() + fallback_poll_s
            batch = await _read(store, thread_id, read_upto)
            held.extend(batch)
            read_upto = batch[-1].seq if batch else read_upto
            read_committed = len(batch) >= EVENT_BATCH
        if held:
            # A step's message waits for the step's end (at most END_WAIT_S): a subscriber that
            # got the end has the last seq, and one that did not is told (a resync) instead.
            now = time.monotonic()
            if not held_until:
                held_until = now + END_WAIT_S
            cursor = _release(held, tracker, cursor, out, forced=now >= held_until)
            if not held or not tracker.waits(held[0]):
                held_until = 0.0
        if out:
            yield out
            quiet_since = time.monotonic()
        elif heartbeat_s is not None and time.monotonic() - quiet_since >= heartbeat_s:
            quiet_since = time.monotonic()
            yield [Heartbeat()]
        if (read_committed and not held) or subscriber.messages or subscriber.overflowed or subscriber.nudged:
            continue
        wait = next_poll - time.monotonic()
        if held:
            wait = min(wait, held_until - time.monotonic())
        if heartbeat_s is not None:
            wait = min(wait, heartbeat_s - (time.monotonic() - quiet_since))
        subscriber.wake.clear()
        if subscriber.messages or subscriber.nudged or subscriber.overflowed:
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(subscriber.wake.wait(), max(wait, 0.0))


def _release(
    held: deque[Event],
    tracker: StepTracker,
    cursor: int,
    out: list[LiveEvent | Heartbeat],
    *,
    forced: bool,
    live: bool = True,
) -> int:
    """Send the held events up to one that waits for its step's end (``forced``: that one too,
    after a resync that says the step's deltas were incomplete); the new cursor. ``live``: not
    catching up on the thread's past."""
    while held:
        event = held[0]
        if tracker.waits(event):
            if not forced:
                break
            out.append(Resync(after=cursor, reason="incomplete"))
        held.popleft()
        cursor = event.seq
        tracker.on_committed(event, live=live)
        out.append(Committed(event))
    return cursor


__all__ = ["END_WAIT_S", "FALLBACK_POLL_S", "StepTracker", "live_event_batches", "live_events"]
