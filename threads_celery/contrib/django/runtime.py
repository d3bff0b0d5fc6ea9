"""The project's runtime handle and its Celery app, from Django's settings."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from threads_celery.contrib.django.configuration import threads_settings

if TYPE_CHECKING:
    from celery import Celery

    from threads_celery.client.threads import Threads
    from threads_celery.definitions.agents import Agent
    from threads_celery.worker.application import RuntimeHolder

_lock = threading.Lock()
#: The process's handle, and the (database, broker) it was made for.
_current: tuple[tuple[str | None, str | None], Threads] | None = None


def get_threads() -> Threads:
    """The project's :class:`~threads_celery.Threads`, one per process, made on first use.

    Made again (the old one closed) when the settings name another database or broker: under
    Django's test runner the default database becomes the test database after start-up, and
    the handle follows it. Call it where it is used (in the view), rather than at import time.
    """
    global _current
    from threads_celery.client.threads import Threads

    settings = threads_settings()
    key = (settings.database_url, settings.broker_url)
    with _lock:
        if _current is not None and _current[0] == key:
            return _current[1]
        previous, made = _current, Threads(settings=settings)
        _current = (key, made)
    if previous is not None:
        previous[1].close()
    return made


def install(app: Celery, *, agents: Iterable[Agent] = ()) -> RuntimeHolder:
    """:func:`threads_celery.install` with the runtime's settings from Django's: call it in
    ``proj/celery.py`` after ``app.config_from_object("django.conf:settings", namespace="CELERY")``.
    The workers load the agents of ``THREADS_AGENTS`` (a setting), and ``agents`` besides."""
    from threads_celery.worker.own_app import install as install_on_app

    return install_on_app(app, agents=agents, settings=threads_settings())


__all__ = ["get_threads", "install"]
