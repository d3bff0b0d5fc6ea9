"""A task of the project's starts a run and hears of its end (``on_finish``) without holding a
worker slot: one worker process of the project's own app (``install(app)``, Redis, PostgreSQL)
with a single slot serves the task, the run's steps and the finish callback in turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.integration import agents_for_tests as agents
from tests.integration import project_celery_app
from tests.support.clients import registered_client
from tests.support.processes import WorkerProcess, subprocess_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

WAIT_S = 60.0


def finish_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def one_slot_worker(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One worker process of the project's app with a single slot: a task that waited on the run
    it started would hold the only slot the run could use."""
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "tests.integration.agents_for_tests",
        }
    )
    process = WorkerProcess(
        "proj1",
        env=env,
        log_path=tmp_path_factory.mktemp("proj1") / "worker.log",
        app="tests.integration.project_celery_app",
        concurrency=1,
    )
    with process.running():
        yield process


def test_a_projects_task_starts_a_run_and_hears_its_end_without_holding_a_slot(
    one_slot_worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "answered.jsonl"
    sender = Celery("proj-sender", broker=integration_redis_url, set_as_current=False)
    sender.conf.task_routes = {"proj.*": {"queue": "proj"}}
    with registered_client(migrated_pg_url, integration_redis_url, agents.ALL_AGENTS):
        sender.send_task("proj.ask", args=[agents.three_steps.name, "add", str(out)])
        (line,) = eventually(
            lambda: finish_lines(out) or None, timeout=WAIT_S, what="proj.answered", detail=one_slot_worker.log_tail
        )
    assert line["status"] == "completed" and line["output"] == "3 and 7", line
    assert line["agent"] == agents.three_steps.name and line["run_id"].startswith("run_")
    assert line["task_id"] == f"finish:{line['run_id']}"  # the same id on every send: one task to act once
    # The project's task ended before the run did: the only slot was free for the run's steps.
    one_slot_worker.wait_for_log(r"Task proj\.ask\[\S+\] succeeded", timeout=5, what="proj.ask succeeded")
    sender.close()


def test_a_cancelled_run_sends_its_finish_too(
    one_slot_worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "answered.jsonl"
    with registered_client(migrated_pg_url, integration_redis_url, agents.ALL_AGENTS) as threads:
        handle = threads.start(agents.asks_first, "count", on_finish=project_celery_app.answered.s(str(out)))
        eventually(lambda: threads.pending(handle.run_id) or None, timeout=WAIT_S, what="the call waiting for a person")
        threads.cancel(handle.run_id, "not today")
        (line,) = eventually(
            lambda: finish_lines(out) or None, timeout=WAIT_S, what="proj.answered", detail=one_slot_worker.log_tail
        )
        assert line["status"] == "aborted" and line["run_id"] == handle.run_id, line
        assert threads.get_run(handle.run_id).status == "aborted"
        # The signature is the run's: the thread's messages (what a front end shows) never carry it.
        assert [m.meta for m in threads.messages(handle.thread_id) if m.role == "user"] == [None]
