"""The Celery application: ``celery -A tasks worker`` and ``celery -A tasks beat``.

Configured from the environment: ``THREADS_DATABASE_URL`` (the ledger), ``THREADS_BROKER_URL``
(the broker) and ``THREADS_AGENTS`` (comma-separated ``module`` or ``module:attribute`` specs of
the agents this worker runs). A configuration that cannot work is one line on stderr and exit
status 2, not a traceback.
"""

from celery import Celery

from threads_celery.runtime.preflight import exit_on_failure
from threads_celery.worker.app import app_from_environment


def _app() -> Celery:
    with exit_on_failure("the Celery app (tasks)"):
        return app_from_environment()


app = _app()

__all__ = ["app"]
