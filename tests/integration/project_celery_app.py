"""A project's own Celery app, configured the Django way (settings named CELERY_*, read with
``config_from_object(..., namespace="CELERY")``), with a task of its own and the runtime
installed on it: ``celery -A tests.integration.project_celery_app worker`` serves both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from celery import Celery

import threads_celery


class ProjectSettings:
    CELERY_BROKER_URL = os.environ.get("THREADS_BROKER_URL", "redis://127.0.0.1:6379/0")
    CELERY_TASK_DEFAULT_QUEUE = "proj"
    CELERY_TASK_SERIALIZER = "json"
    CELERY_TASK_ROUTES: ClassVar[dict[str, dict[str, str]]] = {"proj.*": {"queue": "proj"}}


app = Celery("proj")
app.config_from_object(ProjectSettings, namespace="CELERY")


@app.task(name="proj.record")
def record(path: str, text: str) -> str:
    """The project's own task: it appends ``text`` to the file at ``path``."""
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(text + "\n")
    return text


threads_celery.install(app)
