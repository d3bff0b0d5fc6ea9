"""The worker's side of the bus: coalescing, numbering and sending, never holding a model turn up.

Each step attempt has an :class:`AttemptStream`. The model turn's thread hands it fragments
(:meth:`DeltaSender.fragment`); a fragment that comes :data:`COALESCE_S` or more after the
stream's last flush is flushed at once, and one that comes sooner waits for the rest of that
window with the others (the sender's thread flushes what is still waiting when the window closes).
A flush merges the adjacent fragments of each part into one delta, numbers them (the attempt's
``seq``) and hands one message to the bus.

How the message leaves depends on the bus. On Redis (``redis://``) and RabbitMQ (``amqp://``)
it is written on the spot, from the model turn's thread, to a socket that never blocks
(:meth:`~threads_celery.live.redis_bus.RedisBus.send_now`,
:meth:`~threads_celery.live.amqp_bus.AmqpBus.send_now`): no reply to wait for. Other buses (TLS
connections, the in-process one) get it from the sender's thread, which sends what has queued up
in one batch.

Best effort, bounded, never blocking the worker:
- a full queue (:data:`MAX_PENDING` messages) or a socket that cannot take the bytes drops the
  message; the dropped deltas are counted into the next ``seq`` and into the attempt's end (which
  names its last ``seq``), so a subscriber sees a gap rather than text silently missing, at the
  tail too;
- a send that fails stops sending for a growing pause (up to :data:`MAX_BACKOFF_S`), during which
  everything is dropped at once;
- :meth:`DeltaSender.flush` (called before a step commits, so that no delta of a step arrives
  after its message) waits at most its timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from threads_celery.live.buffers import BufferOp
from threads_celery.live.bus import LiveBus, Outgoing
from threads_celery.live.wire import NUDGE, Fragment, encode_deltas, encode_end

log = logging.getLogger("threads_celery.live.sender")

COALESCE_S = 0.005
MAX_PENDING = 10_000
MAX_BACKOFF_S = 5.0


class DirectBus(Protocol):
    """A bus that can take a message on the caller's thread without ever blocking it."""

    def send_now(self, batch: Sequence[Outgoing]) -> bool:
        """Hand ``batch`` to the transport at once; False when it was dropped."""
        ...


@dataclass(slots=True, eq=False)
class AttemptStream:
    """The bus side of one step attempt: its channel, ids, the numbering of its deltas and the
    fragments waiting for their window to close."""

    channel: str
    run_id: str
    step: int
    attempt: int
    #: The last seq given.
    seq: int = 0
    #: Deltas dropped since the last seq given (counted into the next one).
    dropped: int = 0
    #: Whether a message of this attempt was sent (the first one resets the replay buffer).
    started: bool = False
    pending: list[tuple[str, int, str, str, str]] = field(default_factory=list)
    last_flush: float = 0.0
    armed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class DeltaSender:
    """Sends a process's live messages (see the module's docstring)."""

    def __init__(self, bus: LiveBus, *, coalesce_s: float = COALESCE_S, max_pending: int = MAX_PENDING) -> None:
        self.bus = bus
        # A bus that says it writes directly is a DirectBus; the LiveBus protocol cannot say so:
        self.direct: DirectBus | None = bus if getattr(bus, "direct", False) else None  # type: ignore[assignment]
        prepare = getattr(bus, "prepare", None)
        if callable(prepare):
            prepare()
        self.coalesce_s = coalesce_s
        self.max_pending = max_pending
        self.pid = os.getpid()
        self.sent_messages = 0
        self.dropped = 0
        self._queue: deque[tuple[int, Outgoing]] = deque()
        self._armed: deque[AttemptStream] = deque()
        self._numbers = 0
        self._numbers_lock = threading.Lock()
        self._done = 0
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._paused_until = 0.0
        self._backoff = 0.1
        self._thread = threading.Thread(target=self._run, name="threads-live-sender", daemon=True)
        self._thread.start()

    # -- the worker's side: never blocks --------------------------------------------------------

    def fragment(
        self, stream: AttemptStream, kind: str, part: int, text: str, call_id: str = "", name: str = ""
    ) -> None:
        now = time.monotonic()
        with stream.lock:
            stream.pending.append((kind, part, text, call_id, name))
            if now - stream.last_flush >= self.coalesce_s:
                self._flush(stream, now)
                return
            if stream.armed:
                return
            stream.armed = True
        self._armed.append(stream)
        self._wake.set()

    def end(self, stream: AttemptStream, *, void: bool) -> None:
        """End the attempt's stream: what waits for its window is sent first, then the end, which
        names the attempt's last seq (dropped deltas counted), so that a lost tail shows too."""
        with stream.lock:
            self._flush(stream, time.monotonic())
            stream.started = True
            last_seq = stream.seq + stream.dropped
        payload = encode_end(stream.run_id, stream.step, stream.attempt, void=void, last_seq=last_seq)
        self._emit([Outgoing(stream.channel, payload, "clear")])

    def nudge(self, channel: str) -> None:
        self._emit([Outgoing(channel, NUDGE, "none")])

    def flush(self, timeout: float) -> bool:
        """Wait until what was handed over so far is sent (or dropped); False after ``timeout``."""
        target = self._numbers
        with self._flushed:
            return self._flushed.wait_for(lambda: self._done >= target, timeout)

    def _flush(self, stream: AttemptStream, now: float) -> None:
        """Send the stream's waiting fragments as one message (the caller holds its lock)."""
        stream.last_flush = now
        if not stream.pending:
            return
        group: list[Fragment] = []
        for kind, part, text, call_id, name in stream.pending:
            if group and group[-1][0] == kind and group[-1][1] == part and not stream.dropped:
                last = group[-1]
                group[-1] = (last[0], last[1], last[2], last[3] + text, last[4], last[5])
                continue
            stream.seq += 1 + stream.dropped
            stream.dropped = 0
            group.append((kind, part, stream.seq, text, call_id, name))
        stream.pending = []
        op: BufferOp = "append" if stream.started else "reset"
        payload = encode_deltas(stream.run_id, stream.step, stream.attempt, group)
        if self._emit([Outgoing(stream.channel, payload, op)]):
            stream.started = True
        else:
            # Not sent: a subscriber sees the gap in seq (and the first message sent resets).
            stream.dropped += len(group)
            stream.seq -= len(group)

    def _emit(self, batch: list[Outgoing]) -> bool:
        if self._paused_until > time.monotonic():
            self.dropped += len(batch)
            return False
        if self.direct is not None:
            if self.direct.send_now(batch):
                self.sent_messages += len(batch)
                return True
            self.dropped += len(batch)
            return False
        if len(self._queue) >= self.max_pending:
            self.dropped += len(batch)
            return False
        with self._numbers_lock:
            for out in batch:
                self._numbers += 1
                self._queue.append((self._numbers, out))
        self._wake.set()
        return True

    # -- the sender's thread ----------------------------------------------------------------

    def _run(self) -> None:
        waiting: list[AttemptStream] = []
        while True:
            timeout = None
            if waiting:
                timeout = max(min(s.last_flush for s in waiting) + self.coalesce_s - time.monotonic(), 0.0)
            self._wake.wait(timeout)
            self._wake.clear()
            while self._armed:
                waiting.append(self._armed.popleft())
            now = time.monotonic()
            still: list[AttemptStream] = []
            for stream in waiting:
                with stream.lock:
                    if now - stream.last_flush >= self.coalesce_s or not stream.pending:
                        self._flush(stream, now)
                        stream.armed = False
                    else:
                        still.append(stream)
            waiting = still
            self._send_queued()

    def _send_queued(self) -> None:
        if not self._queue:
            return
        items: list[tuple[int, Outgoing]] = []
        while self._queue:
            items.append(self._queue.popleft())
        try:
            if self._paused_until > time.monotonic():
                self.dropped += len(items)
            else:
                self.bus.send([out for _, out in items])
                self.sent_messages += len(items)
                self._backoff = 0.1
        except Exception as exc:  # noqa: BLE001 - best effort: a failed send is dropped
            self.pause(exc)
        with self._flushed:
            self._done = max(self._done, items[-1][0])
            self._flushed.notify_all()

    def pause(self, exc: BaseException) -> None:
        """Stop sending for a while after ``exc`` (the pause doubles each time, up to a bound)."""
        self._paused_until = time.monotonic() + self._backoff
        log.warning("live deltas not sent (%s: %s); sending again in %.1f s", type(exc).__name__, exc, self._backoff)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)


_senders: dict[int, DeltaSender] = {}
_senders_lock = threading.Lock()


def sender_for(bus: LiveBus, coalesce_s: float | None = None) -> DeltaSender:
    """This process's sender for ``bus`` (a fork gets its own: threads do not survive one),
    coalescing over ``coalesce_s`` when given."""
    with _senders_lock:
        sender = _senders.get(id(bus))
        if sender is None or sender.pid != os.getpid() or sender.bus is not bus:
            sender = DeltaSender(bus)
            _senders[id(bus)] = sender
        if coalesce_s is not None:
            sender.coalesce_s = coalesce_s
        return sender


__all__ = ["COALESCE_S", "AttemptStream", "DeltaSender", "DirectBus", "sender_for"]
