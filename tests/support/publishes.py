"""What a Publisher sends, recorded where it hands each message to Celery (no broker needed).

The publisher builds each task message with ``app.amqp.create_task_message`` and sends it with
``app.amqp.send_task_message`` (``app.send_task`` only for a user's route naming an exchange):
recording the second gives each send's task name and what a test asks of it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest


def record_publishes(monkeypatch: pytest.MonkeyPatch, app: Any, fail: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """Record ``(task name, {"queue", "priority", "shadow", "argsrepr"})`` for every message
    ``app``'s publishers send; ``fail()`` true makes a send raise ConnectionError instead."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> None:
        if fail is not None and fail():
            raise ConnectionError("broker gone")
        headers = message.headers
        queue = options.get("queue")
        sent.append((name, {
            "queue": getattr(queue, "name", queue), "priority": options.get("priority"),
            "shadow": headers.get("shadow"), "argsrepr": headers.get("argsrepr"),
        }))  # fmt: skip

    monkeypatch.setattr(app.amqp, "send_task_message", send_task_message, raising=False)  # built on first use
    monkeypatch.setattr(app, "producer_or_acquire", lambda producer=None: contextlib.nullcontext(producer))
    return sent
