"""Agent tests under Django's test runner: :class:`AgentTestCase`.

``self.threads`` is the runtime the pytest plugin's ``threads`` fixture gives a pytest test: an
embedded :class:`~threads_celery.Threads` (SQLite in a folder of the test's own and an
in-process worker, no services), with the class's ``agents`` registered and the default settings
(no ``THREADS_*`` variable or setting changes a test). It is a Django ``TestCase``, so a test can
use the ORM besides; pytest (with pytest-django) runs these classes as they are.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from django.test import TestCase

from threads_celery.client.threads import Threads
from threads_celery.settings import Settings

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent


class AgentTestCase(TestCase):
    """A Django test case with ``self.threads``, an embedded runtime for each test."""

    #: The agents ``self.threads`` registers.
    agents: ClassVar[Sequence[Agent]] = ()
    #: The runtime's settings: the defaults, read from no environment variable.
    threads_settings: ClassVar[Settings | None] = None

    threads: Threads

    def setUp(self) -> None:
        super().setUp()
        folder = Path(tempfile.mkdtemp(prefix="threads-celery-test-"))
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        settings = self.threads_settings if self.threads_settings is not None else Settings.from_env(env={})
        self.threads = self.enterContext(Threads.embedded(folder / "threads.db", settings=settings))
        for agent in self.agents:
            self.threads.register(agent)


__all__ = ["AgentTestCase"]
