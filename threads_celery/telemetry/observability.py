"""A channel for every agent-tool transition: Python logging plus an in-process subscribe API.

>>> unsubscribe = subscribe("agent_tool", lambda event: print(event.type, event.payload))

Events are published after the transition committed, in the process that made it (a worker,
or a client for dispatches and cancellations). Types: ``agent_tool:dispatched``,
``agent_tool:delivered``, ``agent_tool:interrupted``, ``agent_tool:cancelled`` and
``agent_tool:recovery:row`` (the backbone inspected a silent child). Each is also logged on the
``threads_celery.agent_tool`` logger. A subscriber that raises is logged and ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHANNELS = ("agent_tool",)
log = logging.getLogger("threads_celery.agent_tool")

_subscribers: dict[str, list[Callable[[ObservedEvent], None]]] = {name: [] for name in CHANNELS}
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class ObservedEvent:
    """One transition: ``type`` such as ``agent_tool:delivered`` and a plain payload."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)


def subscribe(channel: str, callback: Callable[[ObservedEvent], None]) -> Callable[[], None]:
    """Call ``callback`` for every event on ``channel``; returns the function that unsubscribes."""
    if channel not in _subscribers:
        raise ValueError(f"unknown channel {channel!r}; channels: {', '.join(CHANNELS)}")
    with _lock:
        _subscribers[channel].append(callback)

    def unsubscribe() -> None:
        with _lock:
            if callback in _subscribers[channel]:
                _subscribers[channel].remove(callback)

    return unsubscribe


def emit(channel: str, type: str, **payload: Any) -> None:
    """Publish an event (after the transition it reports has committed)."""
    event = ObservedEvent(type=type, payload=payload)
    log.info("%s %s", type, payload)
    with _lock:
        callbacks = list(_subscribers.get(channel, ()))
    for callback in callbacks:
        try:
            callback(event)
        except Exception as exc:  # noqa: BLE001 - an observer never breaks the runtime
            log.warning("subscriber to %s failed on %s: %s: %s", channel, type, exc.__class__.__name__, exc)
