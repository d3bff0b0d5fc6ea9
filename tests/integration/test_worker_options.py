"""``threads-celery worker`` passes every ``celery worker`` option through, and a user's Celery
configuration (module and THREADS_CELERY_* variables) reaches the real worker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from celery import Celery

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADS_", "CELERY_"))}
    env.update(
        THREADS_DATABASE_URL=migrated_pg_url,
        THREADS_BROKER_URL=redis_url,
        THREADS_CELERY_CONFIG="options_celery_config",
        THREADS_CELERY_WORKER_SEND_TASK_EVENTS="true",
        PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{tmp_path}",
        PYTHONUNBUFFERED="1",
    )
    log_path = tmp_path / "worker.log"
    argv = [
        sys.executable, "-m", "threads_celery.cli", "worker", "--agents", "options_agents",
        "--autoscale", "3,1", "-n", f"{node}@%h", "-Q", "threads,slow-tools", "--without-mingle",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    app = Celery("probe", broker=redis_url, set_as_current=False)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        stats: dict[str, dict[str, object]] = {}
        while not stats:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            replies = app.control.inspect(timeout=1.0).stats() or {}
            stats = {name: value for name, value in replies.items() if name.startswith(f"{node}@")}
        ((name, worker_stats),) = stats.items()
        # --autoscale reached Celery: the autoscaler reports its bounds.
        assert worker_stats["autoscaler"]["max"] == 3 and worker_stats["autoscaler"]["min"] == 1  # type: ignore[index]
        queues = {
            q["name"]
            for q in (app.control.inspect([name], timeout=2.0).active_queues() or {})[name]
        }
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
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
        app.close()
