"""A model step's stream, as the worker publishes it: redacted, storable, never blocking.

:class:`StepStream` takes the model's fragments on the model turn's thread and hands them to
the process's :class:`~threads_celery.live.sender.DeltaSender`:

- each fragment is made storable exactly as the store boundary does it (every NUL and unpaired
  surrogate becomes U+FFFD: :func:`~threads_celery.records.storable_text`);
- when the thread has secrets (the values of its agent's secret variables on the thread), each
  part holds back its last ``Redactor.longest`` characters, and never cuts through a secret: a
  secret split across two fragments is whole when it is redacted. What is held back goes out
  when the part's stream ends. The secrets other threads' tools revealed in this process
  (:func:`~threads_celery.redaction.known_secrets`, which logs are redacted of) are not the
  thread's: holding back every reply of every thread for them would make no text live at all in a
  worker that ever ran such a tool, and this thread's model never saw them.

:meth:`StepStream.close` ends the attempt's stream (before its message is committed) and waits,
briefly, for the sender to have sent it; :meth:`StepStream.void` says the attempt is void.
"""

from __future__ import annotations

from collections.abc import Sequence

from threads_celery.live.bus import LiveBus
from threads_celery.live.sender import AttemptStream, DeltaSender, sender_for
from threads_celery.live.wire import channel_for
from threads_celery.records import storable_text
from threads_celery.redaction import Redactor, redactor_for

#: How long closing a step's stream waits for its last deltas to be sent, at most.
CLOSE_WAIT_S = 0.05


class StepStream:
    """One step attempt's live stream (one model turn's thread feeds it)."""

    def __init__(
        self,
        bus: LiveBus,
        thread_id: str,
        run_id: str,
        step: int,
        attempt: int,
        *,
        secrets: Sequence[str] = (),
        sender: DeltaSender | None = None,
        coalesce_s: float | None = None,
    ) -> None:
        self.sender = sender or sender_for(bus, coalesce_s)
        self.stream = AttemptStream(channel_for(thread_id, bus.namespace), run_id, step, attempt)
        self.redactor: Redactor | None = redactor_for(frozenset(secrets)) if secrets else None
        #: Per part: the text held back (a secret may start in it), its kind, call id and name.
        self._held: dict[int, list[str]] = {}
        self._closed = False

    def text(self, part: int, text: str) -> None:
        self.fragment("t", part, text)

    def thinking(self, part: int, text: str) -> None:
        self.fragment("h", part, text)

    def call(self, part: int, call_id: str, name: str) -> None:
        """A tool call appeared (its name and id known, its arguments to come). The model chose
        both: they are made storable as its text is (a NUL or a lone surrogate in a tool's name
        is an unknown tool to the turn, and must not stop its stream)."""
        call_id, name = storable_text(call_id), storable_text(name)
        self._held.setdefault(part, ["c", "", call_id, name])
        self.sender.fragment(self.stream, "c", part, "", call_id, name)

    def args(self, part: int, text: str) -> None:
        self.fragment("c", part, text)

    def fragment(self, kind: str, part: int, text: str) -> None:
        """A fragment of ``kind`` (``t`` text, ``h`` thinking, ``c`` a call's arguments)."""
        if self._closed or not text:
            return
        held = self._held.get(part)
        if held is None:
            held = self._held[part] = [kind, "", "", ""]
        if self.redactor is None:
            self.sender.fragment(self.stream, kind, part, storable_text(text), held[2], held[3])
            return
        pending = held[1] + text
        cut = max(len(pending) - self.redactor.longest, 0)
        for start, end in self.redactor.spans(pending):
            if start < cut < end:
                cut = start
        if cut == 0:
            held[1] = pending
            return
        held[1] = pending[cut:]
        out = storable_text(self.redactor.redact(pending[:cut]))
        self.sender.fragment(self.stream, kind, part, out, held[2], held[3])

    def close(self, *, wait_s: float = CLOSE_WAIT_S) -> None:
        """The model turn ended: send what was held back, end the attempt's stream, and wait
        (at most ``wait_s``) until it is sent, so no delta arrives after the step's message."""
        if self._closed:
            return
        for part, (kind, pending, call_id, name) in self._held.items():
            if pending:
                assert self.redactor is not None
                self.sender.fragment(
                    self.stream, kind, part, storable_text(self.redactor.redact(pending)), call_id, name
                )
        self._closed = True
        self.sender.end(self.stream, void=False)
        self.sender.flush(wait_s)

    def void(self) -> None:
        """The model turn failed: what this attempt streamed is void."""
        if self._closed:
            return
        self._closed = True
        self.sender.end(self.stream, void=True)


def nudge(bus: LiveBus, thread_id: str) -> None:
    """Tell the thread's subscribers that something was committed (best effort, never blocks)."""
    sender_for(bus).nudge(channel_for(thread_id, bus.namespace))


__all__ = ["CLOSE_WAIT_S", "StepStream", "nudge"]
