"""The periodic jobs: ``celery -A beat beat`` (or ``threads-celery beat``).

``app`` is the same Celery application as :mod:`tasks`, configured from ``THREADS_BROKER_URL``
(and, for the workers that run the jobs, ``THREADS_DATABASE_URL``). Its ``beat_schedule``
already holds the reconcile backbone: the ``threads.reconcile`` task every
``THREADS_RECONCILE_INTERVAL_S`` seconds (default 5). A tick republishes outbox rows nobody
consumed, re-dispatches steps and calls whose lease expired, and settles interrupted calls by
their effect. Ticks are safe to overlap and to run from two Beats at once, so a duplicate Beat
wastes work but breaks nothing. Scheduled batch agents will join this package.
"""

from tasks import app

__all__ = ["app"]
