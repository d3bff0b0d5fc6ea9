"""Live deltas: what a model step streams, delivered to subscribers outside the ledger.

The worker publishes (:mod:`.step_stream`, :mod:`.sender`) over the broker's Redis, a RabbitMQ
exchange or in process (:mod:`.bus`); an API or client process subscribes once per process
(:mod:`.hub`) and merges the deltas with the thread's committed events (:mod:`.subscription`).
The typed events are in :mod:`.events`.
"""

from threads_celery.live.events import (
    Committed,
    Delta,
    LiveEvent,
    Resync,
    StepEnd,
    StepVoid,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
)

__all__ = [
    "Committed",
    "Delta",
    "LiveEvent",
    "Resync",
    "StepEnd",
    "StepVoid",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallDelta",
]
