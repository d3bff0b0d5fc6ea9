"""``threads-celery worker`` passes every ``celery worker`` option through, and a user's Celery
configuration (module and THREADS_CELERY_* variables) reaches the real worker."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from celery import Celery

from tests.support.processes import REPO_ROOT, THREADS_CELERY, ManagedProcess, subprocess_env
from tests.support.waiting import eventually

READY_TIMEOUT_S = 90.0

CONFIG_MODULE = "worker_prefetch_multiplier = 3\nworker_max_tasks_per_child = 50\n"
AGENTS_MODULE = (
    "from threads_celery import Agent\n"
    "from threads_celery.testing import ScriptedModel, say\n"
    "ok = Agent(name='options-ok', instructions='x', model=ScriptedModel([say('hi')]))\n"
)


def test_autoscale_node_name_and_user_config_reach_the_worker(
    tmp_path: Path, migrated_pg_url: str, redis_url: str
) -> None:
    (tmp_path / "options_agents.py").write_text(AGENTS_MODULE)
    (tmp_path / "options_celery_config.py").write_text(CONFIG_MODULE)
    node = f"slowtools-{uuid.uuid4().hex[:6]}"
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": redis_url,
            "THREADS_CELERY_CONFIG": "options_celery_config",
            "THREADS_CELERY_WORKER_SEND_TASK_EVENTS": "true",
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}",
        }
    )
    argv = [
        THREADS_CELERY, "worker", "--agents", "options_agents",
        "--autoscale", "3,1", "-n", f"{node}@%h", "-Q", "threads,slow-tools", "--without-mingle",
    ]  # fmt: skip
    proc = ManagedProcess("options-worker", argv, env=env, log_path=tmp_path / "worker.log", cwd=tmp_path)
    proc.start()
    app = Celery("probe", broker=redis_url, set_as_current=False)
    try:

        def node_stats() -> dict[str, dict[str, object]]:
            assert proc.alive(), proc.log_text()
            replies = app.control.inspect(timeout=1.0).stats() or {}
            return {name: value for name, value in replies.items() if name.startswith(f"{node}@")}

        stats = eventually(
            node_stats, timeout=READY_TIMEOUT_S, what="the worker answering inspect", detail=proc.log_tail
        )
        ((name, worker_stats),) = stats.items()
        # --autoscale reached Celery: the autoscaler reports its bounds.
        assert worker_stats["autoscaler"]["max"] == 3 and worker_stats["autoscaler"]["min"] == 1  # type: ignore[index]
        queues = {q["name"] for q in (app.control.inspect([name], timeout=2.0).active_queues() or {})[name]}
        assert queues == {
            "threads",
            "slow-tools",
            "threads.control",
        }  # -Q, plus the backbone's queue
        conf = (app.control.inspect([name], timeout=2.0).conf() or {})[name]
        assert conf["worker_prefetch_multiplier"] == 3  # from THREADS_CELERY_CONFIG
        assert conf["worker_max_tasks_per_child"] == 50
        assert conf["task_acks_late"] is True  # ours, still
    finally:
        proc.terminate(timeout=20)
        app.close()
