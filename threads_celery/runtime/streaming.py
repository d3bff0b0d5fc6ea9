"""When a tool call "starts", as the model streams it.

Without a ``progress_argument`` a call starts as soon as it appears in the stream (its name is
known, its arguments may be incomplete). With one, it starts once just that argument has
finished streaming, and its value is the call's ``progress``, so a UI can say "writing
index.html" before a large ``content`` argument arrives. A call whose model never sends the
argument starts when the stream ends, with ``progress`` None.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core

from threads_celery.definitions.tools import Tool
from threads_celery.runtime.models import StreamEvent

log = logging.getLogger("threads_celery.runtime.streaming")

#: How long a step holds a ``tool_call_started`` event back: a model that ends its reply within
#: it has the event recorded with the reply, in the reply's commit (one round trip fewer per
#: step that calls tools); a slower one has it recorded on its own at the next stream event
#: after it. Live deltas tell a UI of the call at once either way.
STARTED_EVENTS_HELD_S = 0.2


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A tool call the model has begun: what ``tool_call_started`` carries."""

    #: The call's position among the calls of this reply (text parts are not counted), which is
    #: the index in its effect key.
    index: int
    call_id: str
    name: str
    progress: str | None

    def payload(self, run_id: str, effect_key: str) -> dict[str, Any]:
        """The ``tool_call_started`` event's payload."""
        return {
            "run_id": run_id,
            "effect_key": effect_key,
            "call_id": self.call_id,
            "name": self.name,
            "progress": self.progress,
        }


class ToolCallStarts:
    """Feeds on stream events and reports each call's start exactly once."""

    def __init__(self, tools: Sequence[Tool], emit: Callable[[ToolCallStarted], None]) -> None:
        self._tools = {t.name: t for t in tools}
        self._emit = emit
        self._calls: dict[int, tuple[str, str]] = {}
        # Stream part index -> position among the reply's calls: a text part before the calls
        # takes a part index, never a call's place.
        self._positions: dict[int, int] = {}
        self._args: dict[int, str] = {}
        self._started: set[int] = set()

    def feed(self, event: StreamEvent) -> None:
        if event.kind == "call":
            self._positions.setdefault(event.index, len(self._positions))
            self._calls[event.index] = (event.name, event.call_id)
            self._args.setdefault(event.index, "")
            if self._argument_of(event.name) is None:
                self._start(event.index, None)
        elif event.kind == "args" and event.index in self._calls and event.index not in self._started:
            self._args[event.index] += event.text
            name, _ = self._calls[event.index]
            argument = self._argument_of(name)
            if argument is None:
                return
            try:
                parsed = pydantic_core.from_json(self._args[event.index], allow_partial=True)
            except ValueError:
                return
            # Partial parsing leaves out a string still streaming: present means finished.
            if isinstance(parsed, dict) and isinstance(parsed.get(argument), str):
                self._start(event.index, parsed[argument])

    def finish(self) -> None:
        """The stream ended: calls that never sent their progress argument start now."""
        for index in sorted(self._calls):
            if index not in self._started:
                self._start(index, None)

    def _argument_of(self, name: str) -> str | None:
        tool = self._tools.get(name)
        return tool.progress_argument if tool is not None else None

    def _start(self, index: int, progress: str | None) -> None:
        self._started.add(index)
        name, call_id = self._calls[index]
        self._emit(ToolCallStarted(index=self._positions[index], call_id=call_id, name=name, progress=progress))


class HeldStartedEvents:
    """The payloads of the ``tool_call_started`` events a step holds back while the model streams.

    ``record`` writes payloads on their own (a statement each, then a nudge of the thread's
    readers); :meth:`feeding` wraps the step's stream callback so that, once the first held
    event is :data:`STARTED_EVENTS_HELD_S` old, the next stream event records them. What is still
    held when the stream ends goes with the reply (``commit_step`` empties :attr:`payloads` once
    committed); a step that fails first records it with :meth:`flush`.
    """

    def __init__(
        self,
        record: Callable[[list[dict[str, Any]]], None],
        *,
        hold_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.payloads: list[dict[str, Any]] = []
        self._record = record
        self._hold_s = STARTED_EVENTS_HELD_S if hold_s is None else hold_s
        self._clock = clock
        self._since = 0.0

    def add(self, payload: dict[str, Any]) -> None:
        if not self.payloads:
            self._since = self._clock()
        self.payloads.append(payload)

    def feeding(self, feed: Callable[[StreamEvent], None]) -> Callable[[StreamEvent], None]:
        """``feed``, then the held events recorded if the first of them has waited long enough."""

        def fed(event: StreamEvent) -> None:
            feed(event)
            if self.payloads and self._clock() - self._since >= self._hold_s:
                self.flush()

        return fed

    def flush(self) -> None:
        """Record what is held now, on its own (a failure is logged: these events are the log's
        account of the stream, and what failed is the step's to handle)."""
        if not self.payloads:
            return
        held = list(self.payloads)
        self.payloads.clear()
        try:
            self._record(held)
        except Exception as exc:  # noqa: BLE001 - best effort, see above
            log.warning("tool_call_started events not recorded: %s: %s", type(exc).__name__, exc)
