"""A model step's live deltas, from the worker's side: the step's stream to the live bus.

:func:`open_step_stream` opens the attempt's :class:`~threads_celery.live.step_stream.StepStream`
(the attempt is the fence of the step's claim, so a retried step streams under a higher one), with
the thread's secrets to redact when its agent declares secret variables; :func:`feed` passes each
model stream event to it. Publishing is best effort: a stream that cannot be opened is no stream,
and the model turn goes on exactly as without one. :func:`nudge` tells a thread's subscribers that
something was committed.
"""

from __future__ import annotations

import logging

from threads_celery.definitions.agents import Agent
from threads_celery.live.bus import LiveBus
from threads_celery.live.step_stream import StepStream
from threads_celery.live.step_stream import nudge as nudge_channel
from threads_celery.live.transports import bus_for
from threads_celery.records import Run
from threads_celery.runtime.models import OnStream, StreamEvent
from threads_celery.runtime.ports import Worker
from threads_celery.runtime.variables import ThreadEnv

log = logging.getLogger("threads_celery.runtime.live_stream")


def live_bus(worker: Worker) -> LiveBus:
    return bus_for(worker.settings.broker_url, worker.settings.database_url)


def open_step_stream(worker: Worker, run: Run, step: int, attempt: int, agent: Agent) -> StepStream | None:
    """The live stream of this step attempt; None when live deltas are off or cannot be sent."""
    if not worker.settings.live_deltas:
        return None
    try:
        secrets: list[str] = []
        declared = agent.declared_variables()
        if any(getattr(v, "type", "text") == "secret" for v in declared.values()):
            env = ThreadEnv(worker.store, worker.registry, run.thread_id, declared, owner=f"agent {agent.name!r}")
            secrets = env.secret_values()
        coalesce_s = worker.settings.live_coalesce_ms / 1000
        return StepStream(
            live_bus(worker), run.thread_id, run.id, step, attempt, secrets=secrets, coalesce_s=coalesce_s
        )
    except Exception as exc:  # noqa: BLE001 - best effort: the turn runs without live deltas
        log.warning("live deltas of run %s step %d off: %s: %s", run.id, step, type(exc).__name__, exc)
        return None


#: A model stream event's kind as a live fragment's (a call's start is passed on apart).
_KINDS = {"text": "t", "thinking": "h", "args": "c"}


def feed(stream: StepStream, event: StreamEvent) -> None:
    """Pass one model stream event to the step's live stream."""
    kind = _KINDS.get(event.kind)
    if kind is not None:
        stream.fragment(kind, event.index, event.text)
    elif event.kind == "call":
        stream.call(event.index, event.call_id, event.name)


def both(first: OnStream, stream: StepStream) -> OnStream:
    """An ``on_stream`` that feeds ``first``, then the live stream (which never raises into the turn)."""

    def on_stream(event: StreamEvent) -> None:
        first(event)
        try:
            feed(stream, event)
        except Exception as exc:  # noqa: BLE001 - best effort: the turn goes on without live deltas
            log.warning("live deltas: %s: %s", type(exc).__name__, exc)

    return on_stream


def close(stream: StepStream) -> None:
    """End the step's live stream before its message commits (best effort: never raises)."""
    try:
        stream.close()
    except Exception as exc:  # noqa: BLE001 - the turn is whole; only its live view is cut short
        log.warning("live deltas: closing the step's stream: %s: %s", type(exc).__name__, exc)


def void(stream: StepStream) -> None:
    """Say the step's partial turn is void (best effort: never raises)."""
    try:
        stream.void()
    except Exception as exc:  # noqa: BLE001 - subscribers also drop it at the next attempt or message
        log.warning("live deltas: voiding the step's stream: %s: %s", type(exc).__name__, exc)


def nudge(worker: Worker, thread_id: str) -> None:
    """Tell the thread's live subscribers that something was committed (best effort)."""
    if not worker.settings.live_deltas:
        return
    try:
        nudge_channel(live_bus(worker), thread_id)
    except Exception as exc:  # noqa: BLE001 - best effort: subscribers also read on a slow timer
        log.debug("live nudge of %s not sent: %s", thread_id, exc)


__all__ = ["both", "close", "feed", "live_bus", "nudge", "open_step_stream", "void"]
