"""A project's own Celery app, configured the Django way (settings named CELERY_*, read with
``config_from_object(..., namespace="CELERY")``), with tasks of its own and the runtime
installed on it: ``celery -A tests.integration.project_celery_app worker`` serves both.

``proj.ask`` starts a run and ends at once; the run's end sends ``proj.answered`` (``on_finish``),
so no worker slot waits on the run.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from celery import Celery

import threads_celery
from threads_celery import Threads


class ProjectSettings:
    CELERY_BROKER_URL = os.environ.get("THREADS_BROKER_URL", "redis://127.0.0.1:6379/0")
    CELERY_TASK_DEFAULT_QUEUE = "proj"
    CELERY_TASK_SERIALIZER = "json"
    CELERY_TASK_ROUTES: ClassVar[dict[str, dict[str, str]]] = {"proj.*": {"queue": "proj"}}
    # The project's own Beat entry, when a test asks for it: proj.record every second.
    CELERY_BEAT_SCHEDULE: ClassVar[dict[str, dict[str, Any]]] = (
        {"proj-heartbeat": {"task": "proj.record", "schedule": 1.0, "args": (os.environ["PROJ_HEARTBEAT"], "beat")}}
        if os.environ.get("PROJ_HEARTBEAT")
        else {}
    )


app = Celery("proj")
app.config_from_object(ProjectSettings, namespace="CELERY")


@app.task(name="proj.record")
def record(path: str, text: str) -> str:
    """The project's own task: it appends ``text`` to the file at ``path``."""
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(text + "\n")
    return text


@cache
def threads() -> Threads:
    """The process's client of the runtime (THREADS_DATABASE_URL, THREADS_BROKER_URL)."""
    return Threads()


@app.task(name="proj.ask")
def ask(agent: str, message: str, path: str) -> str:
    """Start a run of ``agent`` and end: ``proj.answered`` hears how it ended."""
    return threads().start(agent, message, on_finish=answered.s(path)).run_id


@app.task(name="proj.answered", bind=True)
def answered(self: Any, outcome: dict[str, str], path: str) -> None:
    """A run ``proj.ask`` started has ended: note its outcome, its answer and this task's id."""
    run = threads().get_run(outcome["run_id"])
    line = {**outcome, "output": run.output, "task_id": self.request.id}
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


threads_celery.install(app)
