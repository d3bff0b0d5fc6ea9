"""An embedded worker runs in the user's process: its start-up leaves the collector alone.

A worker process of its own freezes its start-up's heap (tests/integration/test_worker_heap.py);
``Threads.embedded()`` runs inside a script, a notebook or a test session, whose objects are the
user's to keep collectable.
"""

from __future__ import annotations

import gc

from threads_celery import Agent, Threads
from threads_celery.testing import ScriptedModel, say


def test_an_embedded_worker_freezes_nothing_in_the_users_process() -> None:
    frozen_before = gc.get_freeze_count()
    agent = Agent(name="heap-embedded", instructions="x", model=ScriptedModel([say("done")]))
    with Threads.embedded() as threads:
        handle = threads.start(agent, "go")
        run = threads.wait(handle.run_id, 30)
        assert run.status == "completed"
        assert gc.get_freeze_count() == frozen_before
