"""The model turn being written, as the terminal shows it while its deltas arrive.

:class:`PartialTurn` takes the live events of one run (:mod:`threads_celery.live`): it appends
each text or thinking delta to its part, forgets a voided attempt or everything on a resync, and
is cleared when the turn's message is committed (the committed message is the truth). The run's
view draws it in its live region, so the text appears as it is written.
"""

from __future__ import annotations

import threading
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from threads_celery.live.events import Resync, StepVoid, TextDelta, ThinkingDelta, ToolCallDelta

#: How much of the partial text the live region shows (its end).
SHOWN_CHARS = 600


class PartialTurn:
    """The partial text of the step in progress (thread-safe: fed by a stream's thread)."""

    def __init__(self) -> None:
        self._parts: dict[int, list[str]] = {}
        self._thinking: set[int] = set()
        self._calls: dict[int, str] = {}
        self._key: tuple[str, int, int] | None = None
        self._lock = threading.Lock()

    def add(self, event: Any) -> None:
        with self._lock:
            if isinstance(event, Resync):
                self._reset(None)
            elif isinstance(event, StepVoid):
                if self._key is not None and self._key[:2] == (event.run_id, event.step):
                    self._reset(None)
            elif isinstance(event, (TextDelta, ThinkingDelta, ToolCallDelta)):
                key = (event.run_id, event.step, event.attempt)
                if key != self._key:
                    self._reset(key)
                if isinstance(event, ToolCallDelta):
                    self._calls[event.part] = event.name
                    return
                self._parts.setdefault(event.part, []).append(event.text)
                if isinstance(event, ThinkingDelta):
                    self._thinking.add(event.part)

    def clear(self) -> None:
        """The turn's message was committed: it shows instead."""
        with self._lock:
            self._reset(None)

    def _reset(self, key: tuple[str, int, int] | None) -> None:
        self._parts, self._thinking, self._calls, self._key = {}, set(), {}, key

    @property
    def writing(self) -> bool:
        return bool(self._parts or self._calls)

    def render(self) -> RenderableType | None:
        with self._lock:
            if not self._parts and not self._calls:
                return None
            line = Text("  ✎ ", style="magenta")
            for part in sorted(self._parts):
                text = "".join(self._parts[part])
                if len(text) > SHOWN_CHARS:
                    text = "…" + text[-SHOWN_CHARS:]
                line.append(text, style="dim italic" if part in self._thinking else "italic")
                line.append(" ")
            for name in self._calls.values():
                line.append(f"⚙ {name}… ", style="yellow")
            return line


__all__ = ["PartialTurn"]
