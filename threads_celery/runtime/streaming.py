"""When a tool call "starts", as the model streams it.

Without a ``progress_argument`` a call starts as soon as it appears in the stream (its name is
known, its arguments may be incomplete). With one, it starts once just that argument has
finished streaming, and its value is the call's ``progress``, so a UI can say "writing
index.html" before a large ``content`` argument arrives. A call whose model never sends the
argument starts when the stream ends, with ``progress`` None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pydantic_core

from threads_celery.definitions.tools import Tool
from threads_celery.runtime.models import StreamEvent


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A tool call the model has begun: what ``tool_call_started`` carries."""

    #: The call's position among the calls of this reply (text parts are not counted), which is
    #: the index in its effect key.
    index: int
    call_id: str
    name: str
    progress: str | None


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
