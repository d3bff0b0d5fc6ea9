"""A worker's cache of thread histories: each model step reads only what is new.

A model step needs the whole history of its thread. Read in full, it costs a statement whose
rows, JSON and conversion grow with the thread, so every turn of a long thread gets slower. A
thread's messages are append-only (each takes the thread's next ``seq``; a deleted thread takes
its messages with it). The one update a message ever takes is a branch's mark: a rewind,
regenerate or edit marks a suffix of the thread ``superseded_by`` it, and every read leaves
those out, so here the suffix is simply gone: the last cached message missing, or a gap in the
``seq`` numbers (:mod:`threads_celery.store.branch_queries`). So a worker keeps the histories it
read and, once the step is claimed, reads in one statement the rows from its last cached
message on, plus its first one:

* both cached ends come back unchanged: the cache is the thread's prefix, and the rows after the
  last one are appended (their ``seq`` must follow on without a gap);
* anything else (a first or last message gone or different, a gap): the history is read in
  full, as without the cache (a full read has gaps where a branch left messages behind).

So a step sees exactly the rows a full read at that moment would see, and another worker
appending to the thread in between is picked up by the same statement. On PostgreSQL that read
is made by the step's claim itself (:class:`Prefetched`): the claim statement takes the ends
this cache holds for the run's thread (:meth:`HistoryCache.ends_for_run`) and returns the rows
with the run, so a step's claim and its history are one round trip. There each row comes with
its version (PostgreSQL's ``xmin``, which a rewrite or a replacement of the row changes): the
cache keeps those of its two ends, and an end whose version has not moved comes back as
"unchanged" instead of whole, so a long first prompt or a large last result is not read again by
every step. An end whose version the cache does not know, or that moved, comes back whole and is
compared as above. The cache is bounded by
an estimate of its size in bytes and by a number of threads (least recently used threads go
first) and lives in one process; pool processes do not share it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from threads_celery.records import Message
from threads_celery.runtime.models import ModelHistory
from threads_celery.store.operations import WHOLE_HISTORY


class MessageSource(Protocol):
    """Where a history is read from: a transaction, or the store (each read a statement of its own)."""

    def list_messages(self, thread_id: str) -> list[Message]: ...

    def list_message_ends(self, thread_id: str, *, first_seq: int, last_seq: int) -> list[Message]: ...


#: Default bounds of one process's cache: an estimate of the bytes its messages hold, and the
#: number of threads (a worker's working set is the runs it is driving; finished threads age out).
DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_MAX_THREADS = 256

#: What one message costs beyond its text, roughly (the objects around it).
_OVERHEAD_BYTES = 400


def message_size(message: Message) -> int:
    """An estimate of the memory one cached message takes (its text and its calls' arguments)."""
    size = _OVERHEAD_BYTES + len(message.text)
    for call in message.tool_calls:
        size += len(call.args) + len(call.name) + _OVERHEAD_BYTES
    if message.tool_result is not None:
        size += len(message.tool_result.content) + _OVERHEAD_BYTES
    return size


@dataclass
class ThreadHistory:
    """One thread's messages in order, and their conversion for the model (filled as needed)."""

    thread_id: str
    messages: list[Message]
    size: int = 0
    converted: ModelHistory | None = field(default=None, repr=False)
    #: The row versions known of its messages (kept for its first and last one only).
    versions: dict[int, str] = field(default_factory=dict, repr=False)

    def model_history(self) -> ModelHistory:
        """The pydantic-ai conversion of these messages, carried over from step to step."""
        if self.converted is None:
            self.converted = ModelHistory()
        return self.converted


class Prefetched:
    """A :class:`MessageSource` that answers, from what was read with a step's claim, the read
    that asks for those messages (``ends``: the ends of the cached copy, or the whole thread),
    and passes any other read to ``source``."""

    def __init__(
        self,
        source: MessageSource,
        thread_id: str,
        ends: tuple[int, int],
        messages: list[Message],
        *,
        versions: dict[int, str] | None = None,
        unchanged: frozenset[int] = frozenset(),
    ) -> None:
        self.source = source
        self.thread_id = thread_id
        self.ends = ends
        self.messages = messages
        #: The row version of each message read, and the ends found unchanged (not read again).
        self.versions = versions or {}
        self.unchanged = unchanged

    def answers(self, thread_id: str, ends: tuple[int, int]) -> bool:
        """Whether this is the read of ``thread_id`` from ``ends`` (not another one)."""
        return thread_id == self.thread_id and ends == self.ends

    def list_messages(self, thread_id: str) -> list[Message]:
        if self.answers(thread_id, WHOLE_HISTORY):
            return list(self.messages)
        return self.source.list_messages(thread_id)

    def list_message_ends(self, thread_id: str, *, first_seq: int, last_seq: int) -> list[Message]:
        """The messages read, without the ends found unchanged (see :meth:`HistoryCache.load`)."""
        if self.answers(thread_id, (first_seq, last_seq)):
            return list(self.messages)
        return self.source.list_message_ends(thread_id, first_seq=first_seq, last_seq=last_seq)


def _read_facts(source: MessageSource, thread_id: str, ends: tuple[int, int]) -> tuple[dict[int, str], frozenset[int]]:
    """What ``source`` knows of the rows it read from ``ends``: their versions, and the ends it
    found unchanged (only a step's prefetched read knows either)."""
    if isinstance(source, Prefetched) and source.answers(thread_id, ends):
        return source.versions, source.unchanged
    return {}, frozenset()


class HistoryCache:
    """Thread histories of one worker process, checked against the store on every read."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_threads: int = DEFAULT_MAX_THREADS) -> None:
        self.max_bytes = max_bytes
        self.max_threads = max_threads
        self._entries: OrderedDict[str, ThreadHistory] = OrderedDict()
        # Which thread a run's steps read, for the runs whose history was read here: a step asks
        # for its history with its claim, before it has read the run (see :meth:`ends_for_run`).
        self._threads_of_runs: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The estimated bytes held now."""
        return self._bytes

    def ends_for_run(self, run_id: str) -> tuple[tuple[int, int], tuple[str | None, str | None]]:
        """What :meth:`load` will ask of the store for ``run_id``'s thread, as far as this cache can
        tell before the run is read: the first and last seq of its cached history, or
        :data:`WHOLE_HISTORY` (a run not seen here, or a thread no longer cached); and the row
        versions it knows of those two messages (None where it knows none)."""
        with self._lock:
            thread_id = self._threads_of_runs.get(run_id)
            entry = self._entries.get(thread_id) if thread_id is not None else None
            if entry is None or not entry.messages:
                return WHOLE_HISTORY, (None, None)
            first, last = entry.messages[0].seq, entry.messages[-1].seq
            return (first, last), (entry.versions.get(first), entry.versions.get(last))

    def load(self, tx: MessageSource, thread_id: str, *, run_id: str | None = None) -> ThreadHistory:
        """The thread's whole history as ``tx`` sees it, reading only what the cache lacks.

        The returned history is the caller's to read; its message list is a copy. ``run_id``:
        the run the history is read for, remembered for :meth:`ends_for_run`.
        """
        with self._lock:
            if run_id is not None:
                self._threads_of_runs[run_id] = thread_id
                self._threads_of_runs.move_to_end(run_id)
                while len(self._threads_of_runs) > 4 * self.max_threads:
                    self._threads_of_runs.popitem(last=False)
            entry = self._entries.pop(thread_id, None)
            if entry is not None:
                self._bytes -= entry.size
        fresh = self._extend(tx, entry) if entry is not None and entry.messages else None
        if fresh is None:
            self.misses += 1
            messages = tx.list_messages(thread_id)
            fresh = ThreadHistory(thread_id, messages, sum(message_size(m) for m in messages))
            fresh.versions = _ends_only(fresh, _read_facts(tx, thread_id, WHOLE_HISTORY)[0])
        else:
            self.hits += 1
        # The conversion belongs to the cached entry, so the next step carries it on.
        result = ThreadHistory(thread_id, list(fresh.messages), fresh.size, fresh.model_history())
        with self._lock:
            self._store(fresh)
        return result

    def _extend(self, tx: MessageSource, entry: ThreadHistory) -> ThreadHistory | None:
        """The cached history with the rows appended since, or None when it is not a prefix."""
        first, last = entry.messages[0], entry.messages[-1]
        rows = tx.list_message_ends(entry.thread_id, first_seq=first.seq, last_seq=last.seq)
        versions, unchanged = _read_facts(tx, entry.thread_id, (first.seq, last.seq))
        # Each end is either found unchanged by its version (not read again) or read and equal.
        for end in (first, last) if first.seq != last.seq else (last,):
            if end.seq in unchanged:
                continue
            if not rows or rows[0] != end:
                return None
            rows = rows[1:]
        added = rows
        for expected, message in enumerate(added, start=last.seq + 1):
            if message.seq != expected:
                return None
        if added:
            entry.messages.extend(added)
            entry.size += sum(message_size(m) for m in added)
        entry.versions = _ends_only(entry, {**entry.versions, **versions})
        return entry

    def _store(self, entry: ThreadHistory) -> None:
        if entry.size > self.max_bytes:
            return
        previous = self._entries.pop(entry.thread_id, None)
        if previous is not None:  # another thread of this process read it meanwhile
            self._bytes -= previous.size
        self._entries[entry.thread_id] = entry
        self._bytes += entry.size
        while (self._bytes > self.max_bytes or len(self._entries) > self.max_threads) and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size

    def clear(self) -> None:
        """Forget every cached history."""
        with self._lock:
            self._entries.clear()
            self._threads_of_runs.clear()
            self._bytes = 0


def _ends_only(history: ThreadHistory, versions: dict[int, str]) -> dict[int, str]:
    """``versions`` of ``history``'s first and last message (what a later read asks about)."""
    if not history.messages:
        return {}
    ends = (history.messages[0].seq, history.messages[-1].seq)
    return {seq: versions[seq] for seq in ends if seq in versions}


def as_messages(history: ThreadHistory | Sequence[Message]) -> Sequence[Message]:
    """The messages of a history, whichever form it comes in."""
    return history.messages if isinstance(history, ThreadHistory) else history


__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_THREADS",
    "WHOLE_HISTORY",
    "HistoryCache",
    "MessageSource",
    "Prefetched",
    "ThreadHistory",
    "message_size",
]
