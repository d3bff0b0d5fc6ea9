"""threads-celery in a Django project: add ``"threads_celery.contrib.django"`` to
``INSTALLED_APPS``.

- :func:`get_threads` gives the project its :class:`~threads_celery.Threads` (one per process),
  configured from Django's settings (:func:`threads_settings`): the ledger lives in the project's
  default database, in tables of its own, unless ``THREADS_DATABASE_URL`` says otherwise, and
  the broker is ``CELERY_BROKER_URL``'s.
- :func:`install` puts the runtime on the project's Celery app (``proj/celery.py``).
- ``manage.py threads worker|beat|migrate`` run the project's worker and Beat, and the ledger's
  migrations (which ``manage.py migrate`` also applies).
- ``threads.start(..., within=connection)`` inside ``transaction.atomic()`` writes the run in the
  view's transaction (:mod:`threads_celery.client.caller_tx`).
- :class:`~threads_celery.contrib.django.testing.AgentTestCase` runs agent tests under Django's
  test runner, as the pytest plugin's ``threads`` fixture does under pytest.

Importing this package imports neither Django nor the runtime: its names load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from threads_celery.contrib.django.configuration import database_url, threads_settings
    from threads_celery.contrib.django.runtime import get_threads, install

_EXPORTS = {
    "database_url": "configuration",
    "threads_settings": "configuration",
    "get_threads": "runtime",
    "install": "runtime",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = ["database_url", "get_threads", "install", "threads_settings"]
