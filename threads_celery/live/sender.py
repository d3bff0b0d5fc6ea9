"""The worker's side of the bus: a sender thread, so that publishing never holds a model turn up.

The model turn's thread hands each fragment to :class:`DeltaSender` (an append to a bounded
queue: no I/O, no lock held for long, no wait). The sender thread wakes, lets :data:`COALESCE_S`
pass to gather what else arrives, merges the adjacent fragments of each part into one delta,
numbers them (the step attempt's ``seq``) and sends the batch in one round trip.

Best effort, bounded, never blocking the worker:
- a full queue (:data:`MAX_PENDING` items) drops the fragment; the dropped count is added to the
  attempt's ``seq``, so a subscriber sees a gap rather than text silently missing;
- a send that fails (the bus is down, times out) drops its batch and stops sending for a
  growing pause (up to :data:`MAX_BACKOFF_S`), during which everything is dropped at once;
- :meth:`DeltaSender.flush` (called before a step commits, so no delta of a step arrives after
  its message) waits at most its timeout.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

from threads_celery.live.buffers import BufferOp
from threads_celery.live.bus import LiveBus, Outgoing
from threads_celery.live.wire import NUDGE, Fragment, encode_deltas, encode_end

log = logging.getLogger("threads_celery.live.sender")

COALESCE_S = 0.004
MAX_PENDING = 20_000
MAX_BACKOFF_S = 5.0


@dataclass(slots=True, eq=False)
class AttemptStream:
    """The bus side of one step attempt: its channel, ids and the numbering of its deltas."""

    channel: str
    run_id: str
    step: int
    attempt: int
    #: The last seq given (sender thread only).
    seq: int = 0
    #: Fragments the worker's thread dropped (worker thread only) and how many of them the
    #: sender has counted into ``seq``.
    dropped: int = 0
    dropped_counted: int = 0
    #: Whether a message of this attempt was sent (the first one resets the replay buffer).
    started: bool = False


# (number, kind, stream or channel, fragment-or-void)
_Item = tuple[int, str, object, object]


class DeltaSender:
    """Sends a process's live messages on its own thread (see the module's docstring)."""

    def __init__(self, bus: LiveBus, *, coalesce_s: float = COALESCE_S, max_pending: int = MAX_PENDING) -> None:
        self.bus = bus
        self.coalesce_s = coalesce_s
        self.max_pending = max_pending
        self.pid = os.getpid()
        self.sent_messages = 0
        self.dropped = 0
        self._items: deque[_Item] = deque()
        self._numbers = itertools.count(1)
        self._last_number = 0
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
        if len(self._items) >= self.max_pending or self._paused_until > time.monotonic():
            stream.dropped += 1
            self.dropped += 1
            return
        self._put("f", stream, (kind, part, text, call_id, name))

    def end(self, stream: AttemptStream, *, void: bool) -> None:
        self._put("e", stream, void)

    def nudge(self, channel: str) -> None:
        self._put("n", channel, None)

    def flush(self, timeout: float) -> bool:
        """Wait until what was handed over so far is sent (or dropped); False after ``timeout``."""
        target = self._last_number
        with self._flushed:
            return self._flushed.wait_for(lambda: self._done >= target, timeout)

    def _put(self, kind: str, target: object, value: object) -> None:
        number = next(self._numbers)
        self._items.append((number, kind, target, value))
        self._last_number = number
        if not self._wake.is_set():
            self._wake.set()

    # -- the sender thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.coalesce_s)
            self._wake.clear()
            items: list[_Item] = []
            while self._items:
                items.append(self._items.popleft())
            if not items:
                continue
            try:
                self._send(items)
            except Exception as exc:  # noqa: BLE001 - best effort: a failed send is dropped
                self._pause(exc)
            with self._flushed:
                self._done = max(self._done, items[-1][0])
                self._flushed.notify_all()

    def _send(self, items: list[_Item]) -> None:
        batch = self.batch_of(items)
        if not batch:
            return
        if self._paused_until > time.monotonic():
            self.dropped += len(batch)
            return
        self.bus.send(batch)
        self.sent_messages += len(batch)
        self._backoff = 0.1

    def _pause(self, exc: Exception) -> None:
        self._paused_until = time.monotonic() + self._backoff
        log.warning("live deltas not sent (%s: %s); sending again in %.1f s", type(exc).__name__, exc, self._backoff)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    @staticmethod
    def batch_of(items: list[_Item]) -> list[Outgoing]:
        """The messages for ``items``, in order: each run of one attempt's fragments is one
        message, adjacent fragments of one part merged into one delta."""
        out: list[Outgoing] = []
        group: list[Fragment] = []
        current: AttemptStream | None = None
        nudged: set[str] = set()

        def close() -> None:
            if current is not None and group:
                op: BufferOp = "append" if current.started else "reset"
                current.started = True
                out.append(
                    Outgoing(current.channel, encode_deltas(current.run_id, current.step, current.attempt, group), op)
                )

        for _, kind, target, value in items:
            if kind == "f":
                assert isinstance(target, AttemptStream)
                if target is not current:
                    close()
                    group, current = [], target
                fkind, part, text, call_id, name = cast(tuple[str, int, str, str, str], value)
                if (
                    group
                    and group[-1][0] == fkind
                    and group[-1][1] == part
                    and target.dropped == target.dropped_counted
                ):
                    last = group[-1]
                    group[-1] = (last[0], last[1], last[2], last[3] + text, last[4], last[5])
                    continue
                target.seq += 1 + target.dropped - target.dropped_counted
                target.dropped_counted = target.dropped
                group.append((fkind, part, target.seq, text, call_id, name))
                continue
            close()
            group, current = [], None
            if kind == "e":
                assert isinstance(target, AttemptStream)
                payload = encode_end(target.run_id, target.step, target.attempt, void=bool(value))
                out.append(Outgoing(target.channel, payload, "clear"))
            elif kind == "n":
                channel = str(target)
                if channel not in nudged:
                    nudged.add(channel)
                    out.append(Outgoing(channel, NUDGE, "none"))
        close()
        return out


_senders: dict[int, DeltaSender] = {}
_senders_lock = threading.Lock()


def sender_for(bus: LiveBus) -> DeltaSender:
    """This process's sender for ``bus`` (a fork gets its own: threads do not survive one)."""
    with _senders_lock:
        sender = _senders.get(id(bus))
        if sender is None or sender.pid != os.getpid() or sender.bus is not bus:
            sender = DeltaSender(bus)
            _senders[id(bus)] = sender
        return sender


__all__ = ["COALESCE_S", "AttemptStream", "DeltaSender", "sender_for"]
