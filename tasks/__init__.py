"""The Celery application: ``celery -A tasks worker`` and ``celery -A tasks beat``.

Configured from the environment: ``THREADS_DATABASE_URL`` (the ledger), ``THREADS_BROKER_URL``
(the broker) and ``THREADS_AGENTS`` (comma-separated ``module`` or ``module:attribute`` specs of
the agents this worker runs).
"""

from threads_celery.worker import app_from_environment

app = app_from_environment()

__all__ = ["app"]
