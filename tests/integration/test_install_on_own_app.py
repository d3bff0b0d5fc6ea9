"""threads_celery.install(app) on a real worker of the project's own Celery app (Redis,
PostgreSQL): one worker serves the project's task and agent runs side by side."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.integration import agents_for_tests as agents
from tests.support.clients import registered_client
from tests.support.processes import WorkerProcess, subprocess_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

WAIT_S = 60.0


@pytest.fixture(scope="module")
def project_worker(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "tests.integration.agents_for_tests",
        }
    )
    process = WorkerProcess(
        "proj",
        env=env,
        log_path=tmp_path_factory.mktemp("proj") / "worker.log",
        app="tests.integration.project_celery_app",
    )
    with process.running():
        yield process


def test_one_worker_of_the_projects_app_serves_its_task_and_agent_runs(
    project_worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str, tmp_path: Path
) -> None:
    # The worker consumes the project's queue and the runtime's, and said the agents it loaded.
    project_worker.wait_for_log(r"\.> proj ", timeout=10, what="the project's queue")
    project_worker.wait_for_log(r"\.> threads\.control ", timeout=10, what="the control queue")

    sender = Celery("proj-sender", broker=integration_redis_url, set_as_current=False)
    sender.conf.task_routes = {"proj.*": {"queue": "proj"}}
    out = tmp_path / "recorded.txt"
    sender.send_task("proj.record", args=[str(out), "order 42 saved"])

    with registered_client(migrated_pg_url, integration_redis_url, agents.ALL_AGENTS) as threads:
        handle = threads.start(agents.three_steps, "add")
        run: Any = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed" and run.output == "3 and 7", project_worker.log_tail()
    eventually(
        lambda: out.exists() and out.read_text() == "order 42 saved\n",
        timeout=WAIT_S,
        what="the project's task",
        detail=project_worker.log_tail,
    )
