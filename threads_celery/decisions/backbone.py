"""The reconcile backbone's routing and pacing: pure functions, no Celery, no I/O.

Work (model steps, tool calls) and control (reconcile ticks, finish deliveries, scheduled-run
starts) travel on different queues. Work may pile up by the thousand; control must not wait
behind it, or recovery slows to the speed of the backlog. Every worker consumes the control
queue besides its work queues (see :func:`threads_celery.worker.application.consume_control_queue`), and a
deployment may add a small worker that consumes only the control queue.

A tick is never thrown away because it is late (an ``expires`` on the tick discarded every tick
behind a backlog). Instead a tick is skipped only when another tick *started after it was
published*, in the same worker process: that later tick did all the work the skipped one would
have done. After an outage, when ticks pile up in the control queue, the pile costs one real
tick per worker process and a cheap skip for each of the rest.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from threads_celery.decisions.retry import REPUBLISH_BACKOFF

WORK_QUEUE: Final = "threads"
"""The queue of model steps and tool calls that name no queue of their own."""

CONTROL_SUFFIX: Final = ".control"
CONTROL_QUEUE: Final = WORK_QUEUE + CONTROL_SUFFIX
"""The queue of the backbone's tasks: ``threads.control``."""

RECONCILE_TASK: Final = "threads.reconcile"
DELIVER_TASK: Final = "threads.deliver"
SCHEDULED_RUN_TASK: Final = "threads.scheduled_run"
RETENTION_TASK: Final = "threads.retention_sweep"
"""One bounded batch of the retention sweep (Beat starts a sweep; each batch publishes the next)."""

CONTROL_TASKS: Final = frozenset({RECONCILE_TASK, DELIVER_TASK, SCHEDULED_RUN_TASK, RETENTION_TASK})
"""Tasks that keep the control queue whatever an agent or tool asks for."""

__all__ = [
    "CONTROL_QUEUE",
    "CONTROL_TASKS",
    "DELIVER_TASK",
    "RECONCILE_TASK",
    "RETENTION_TASK",
    "SCHEDULED_RUN_TASK",
    "URGENT_PRIORITY",
    "WORK_PRIORITY",
    "WORK_QUEUE",
    "check_queue_name",
    "control_queue_for",
    "message_priority",
    "queue_for",
    "republish_delay",
    "tick_is_covered",
]

WORK_PRIORITY: Final = 3
"""Redis priority of ordinary work messages (Redis serves lower numbers first)."""
URGENT_PRIORITY: Final = 0
"""Redis priority of control messages and of the runs the backbone re-dispatches from a dead
worker (not of rows it merely republishes: behind a backlog those are mostly waiting, not lost).

Kombu's Redis transport pops the lowest priority number first *across all the queues a worker
consumes*, so the control queue's messages must be at least as urgent as any work message, or a
worker busy with a backlog would never get to them.
"""


def control_queue_for(work_queue: str) -> str:
    """The control queue paired with ``work_queue`` (``threads`` -> ``threads.control``). The
    work queues of every deployment version share one (``threads@v2`` -> ``threads.control``):
    recovery never waits for a worker of one particular version."""
    return work_queue.split("@", 1)[0] + CONTROL_SUFFIX


def queue_for(task: str, requested: str | None, *, work_queue: str | None, control_queue: str) -> str | None:
    """The queue a task message goes to.

    Control tasks always take ``control_queue``. Work takes ``work_queue`` when it is set (the
    embedded worker consumes one work queue of its own, whatever the routing), else the queue
    the agent or tool asked for, else None (Celery's default queue).
    """
    if task in CONTROL_TASKS:
        return control_queue
    return work_queue or requested


def check_queue_name(owner: str, queue: object) -> str | None:
    """Validate an agent's or tool's ``queue=``; the reason it is refused, or None when it is fine.

    A queue must be a non-empty string and must not be a control queue: control tasks keep
    theirs, so slow work routed there would delay recovery again.
    """
    if queue is None:
        return None
    if not isinstance(queue, str) or not queue.strip():
        return f"{owner}: queue must be a non-empty string"
    if queue.endswith(CONTROL_SUFFIX):
        return f"{owner}: queue {queue!r} is reserved for the backbone's control tasks (names ending in {CONTROL_SUFFIX!r})"
    return None


def tick_is_covered(published_at: float | None, last_tick_started_at: float | None) -> bool:
    """Whether a tick published at ``published_at`` may be skipped.

    It may when a tick started at or after that moment (in this process), because that tick
    swept everything the late one would sweep. A tick that does not say when it was published
    (an older Beat, a manual ``send_task``) always runs.
    """
    if published_at is None or last_tick_started_at is None:
        return False
    return last_tick_started_at >= published_at


def republish_delay(grace: timedelta, republished: int) -> timedelta:
    """How long after a republish an outbox row is due again: ``grace`` doubled per republish
    already made (2x, 4x, 8x), at most 16 times ``grace`` (the policy is
    :data:`threads_celery.decisions.retry.REPUBLISH_BACKOFF`).

    A row is republished when nobody consumed its message within the grace. Behind a backlog the
    message is only waiting in the queue; republishing it every grace would add a copy per tick
    and grow the backlog it waits behind. A message that was really lost (a broker restart) still
    comes back after one grace.
    """
    return grace * REPUBLISH_BACKOFF.delay_s(max(republished, 0) + 1)


def message_priority(task: str, *, recovered: bool, broker_url: str) -> int | None:
    """The priority a message is published with, or None (the broker's default).

    On Redis, control messages and recovered work (a dead worker's run re-dispatched) go ahead
    of the work waiting in the queues: behind a backlog,
    recovered work would otherwise wait its turn, and an idempotent call could outlive its dedup
    window and park. Other brokers keep their own order (RabbitMQ counts priorities the other
    way round, and only on queues declared with a maximum priority).
    """
    if not broker_url.startswith(("redis://", "rediss://", "redis+socket://")):
        return None
    return URGENT_PRIORITY if recovered or task in CONTROL_TASKS else WORK_PRIORITY
