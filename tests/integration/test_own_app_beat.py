"""Scheduled batch agents on the Beat of a project's own Celery app (``install(app)``).

``celery -A tests.integration.project_celery_app beat`` runs with Celery's own scheduler (the
project's choice, its schedule file) and with the runtime's (``-S
threads_celery.worker.beat:Scheduler``): either way it publishes the project's own entry
(``proj.record`` every second) and the agents' ``SCHEDULES`` beside it, and one worker of the app
runs both. Each slot is one run, its id derived from the slot.
"""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import registered_client
from tests.support.processes import REPO_ROOT, ManagedProcess, WorkerProcess, subprocess_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

WAIT_S = 60.0
AGENTS_SOURCE = textwrap.dedent(
    """
    import os
    from datetime import timedelta

    from threads_celery import Agent
    from threads_celery.runtime.schedules import Schedule
    from threads_celery.testing import ScriptedModel, say

    pinger = Agent(name="it_proj_pinger", instructions="Ping.", model=ScriptedModel([say("pong")]))

    SCHEDULES = [Schedule(os.environ["PROJ_SCHEDULE"], pinger, "ping", every=timedelta(seconds=1))]
    """
)


def ours_of(name: str) -> Any:
    def ours(threads: Any) -> list[Any]:
        """The runs of this test's schedule (their ids are ``sched:<name>:<slot>``)."""
        return [r for r in threads.runs(limit=1000) if r.id.startswith(f"sched:{name}:")]

    return ours


@pytest.mark.parametrize("scheduler", ["celery's own", "the runtime's"])
def test_the_apps_beat_publishes_its_own_entry_and_the_agents_schedules(
    scheduler: str, migrated_pg_url: str, integration_redis_url: str, tmp_path: Path
) -> None:
    name = f"proj-ping-{uuid.uuid4().hex[:8]}"
    (tmp_path / "proj_beat_agents.py").write_text(AGENTS_SOURCE)
    heartbeat = tmp_path / "heartbeat.txt"
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "proj_beat_agents",
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}",
            "PROJ_HEARTBEAT": str(heartbeat),
            "PROJ_SCHEDULE": name,
        }
    )
    ours = ours_of(name)
    app = "tests.integration.project_celery_app"
    beat_argv = [sys.executable, "-m", "celery", "-A", app, "beat", "--schedule", str(tmp_path / "beat-state"),
                 "--loglevel", "INFO"]  # fmt: skip
    if scheduler == "the runtime's":
        beat_argv += ["-S", "threads_celery.worker.beat:Scheduler"]
    worker = WorkerProcess("projbeat", env=env, log_path=tmp_path / "worker.log", app=app, cwd=tmp_path)
    beat = ManagedProcess("projbeat-beat", beat_argv, env=env, log_path=tmp_path / "beat.log", cwd=tmp_path)
    os.environ["PROJ_SCHEDULE"] = name  # for this process's import of the agents' module
    sys.path.insert(0, str(tmp_path))
    try:
        import proj_beat_agents  # type: ignore[import-not-found]

        with (
            worker.running(),
            registered_client(migrated_pg_url, integration_redis_url, [proj_beat_agents.pinger]) as threads,
        ):
            beat.start()
            try:

                def completed_runs() -> list[Any] | None:
                    assert beat.alive(), beat.log_tail()
                    done = [r for r in ours(threads) if r.status == "completed"]
                    return done if len(done) >= 2 else None

                done = eventually(completed_runs, timeout=WAIT_S, what="two scheduled runs", detail=beat.log_tail)
                eventually(
                    lambda: heartbeat.exists() and heartbeat.read_text().count("beat\n") >= 2,
                    timeout=WAIT_S,
                    what="the project's own Beat entry",
                    detail=worker.log_tail,
                )
            finally:
                beat.terminate()
            every = ours(threads)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("proj_beat_agents", None)
        del os.environ["PROJ_SCHEDULE"]
    assert all(r.output == "pong" for r in done)
    # One run per slot: a slot's run id is its slot.
    assert Counter(r.id for r in every).most_common(1)[0][1] == 1
