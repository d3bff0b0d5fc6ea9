"""The Celery side of the worker: ``celery -A threads_celery.worker worker`` (and ``beat``).

- :mod:`threads_celery.worker.application`: the app (:func:`~threads_celery.worker.application.create_app`,
  the one configured from ``THREADS_*`` variables), the runtime its tasks use, start-up checks;
- :mod:`threads_celery.worker.tasks`: the task bodies;
- :mod:`threads_celery.worker.beat`: Beat's scheduler (the reconcile backbone and scheduled agents);
- :mod:`threads_celery.worker.embedded`: the in-process worker of ``Threads.embedded()``;
- :mod:`threads_celery.worker.flower_gate`: ``threads-celery flower``, Flower behind credentials.

``app`` is built from the environment (``THREADS_DATABASE_URL``, ``THREADS_BROKER_URL``,
``THREADS_AGENTS``) when first asked for, so the package imports without a configured
environment. A configuration that cannot work is one line on stderr and exit status 2, not a
traceback. The repository's ``tasks`` and ``beat`` packages re-export this app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threads_celery.runtime.preflight import exit_on_failure
from threads_celery.worker.application import ThreadsCelery, app_from_environment

if TYPE_CHECKING:
    app: ThreadsCelery

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    # Built on first access, and kept so that every importer gets the same app: importing the
    # package, or one of its modules, must not need a configured environment.
    if name == "app":
        with exit_on_failure("the Celery app (threads_celery.worker)"):
            built = app_from_environment()
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
