"""The periodic jobs: ``celery -A beat beat`` (or ``celery -A tasks beat``, ``threads-celery beat``).

``app`` is the same Celery application as :mod:`tasks`, configured from ``THREADS_BROKER_URL``
(and, for the workers that run the jobs, ``THREADS_DATABASE_URL``); it is built when first
asked for, so ``beat.schedule`` imports without a configured environment. Its
``beat_schedule`` holds two kinds of job:

- The reconcile backbone: the ``threads.reconcile`` task every ``THREADS_RECONCILE_INTERVAL_S``
  seconds (default 5). A tick republishes outbox rows nobody consumed, re-dispatches steps and
  calls whose lease expired, and settles interrupted calls by their effect. Ticks are safe to
  overlap and to run from two Beats at once, so a duplicate Beat wastes work but breaks nothing.
- Scheduled batch agents (:mod:`beat.schedule`): the ``SCHEDULES`` declared in the modules of
  ``THREADS_AGENTS``, each published as ``threads.scheduled_run(name, slot)`` once per slot. Two
  Beats publish the same slot, and the run id derived from it makes that one run.
"""

from typing import Any

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from tasks import app

        return app
    raise AttributeError(f"module 'beat' has no attribute {name!r}")
