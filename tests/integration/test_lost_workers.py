"""A step or call that kills the pool process running it ends its run instead of running for ever.

A real prefork worker (2 pool processes, PostgreSQL ledger, Redis broker) runs a read_only and an
idempotent tool that call ``os._exit`` (as a crash, the out-of-memory killer or the hard time limit
would end the process), one that outlasts the hard time limit, and an agent whose context hook
calls ``os._exit`` in the model step. Celery gives
each message back to the broker; the worker's main process counts each loss in the ledger; the
delivery after the ``THREADS_MAX_TASK_FAILURES``-th (3) ends the run ``error``, saying why, and
settles the call. The worker replaces its pool processes and goes on: a next run completes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import registered_client
from tests.support.processes import WorkerProcess, subprocess_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

AGENTS = "tests.integration.killer_agents"
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def killer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("killers")


@pytest.fixture(scope="module")
def worker(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory, killer_dir: Path
) -> Iterator[WorkerProcess]:
    env = subprocess_env({
        "THREADS_DATABASE_URL": migrated_pg_url, "THREADS_BROKER_URL": integration_redis_url,
        "THREADS_AGENTS": AGENTS, "KILLER_DIR": str(killer_dir),
        # Short enough for the stubborn tool to reach the hard limit quickly.
        "THREADS_TASK_TIME_LIMIT_S": "4", "THREADS_TASK_SOFT_TIME_LIMIT_S": "2",
    })  # fmt: skip
    process = WorkerProcess(
        "lost-w1", env=env, log_path=tmp_path_factory.mktemp("worker") / "lost-w1.log", concurrency=2
    )
    with process.running():
        yield process


@pytest.fixture(scope="module")
def threads(worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str) -> Iterator[Any]:
    from tests.integration.killer_agents import ALL_AGENTS

    with registered_client(migrated_pg_url, integration_redis_url, ALL_AGENTS) as client:
        yield client


def _runs(killer_dir: Path, name: str) -> int:
    path = killer_dir / f"{name}.runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _ended(threads: Any, run_id: str) -> Any:
    run = threads.get_run(run_id)
    return run if run.is_terminal else None


@pytest.mark.parametrize("effect", ["read_only", "idempotent"])
def test_a_call_that_kills_its_worker_ends_the_run_after_three_losses(
    threads: Any, worker: WorkerProcess, killer_dir: Path, effect: str
) -> None:
    handle = threads.start(f"killer_{effect}", "go")
    run = eventually(lambda: _ended(threads, handle.run_id), timeout=DEADLINE_S, what="the run to end")
    assert run.status == "error", run
    assert run.error is not None and "was lost 3 times" in run.error and f"die_{effect}" in run.error, run.error
    assert _runs(killer_dir, f"die_{effect}") == 3  # run three times, not a fourth
    [call] = [c for m in threads.messages(run.thread_id) for c in m.tool_calls]
    with threads.store.read() as tx:
        loaded = tx.get_call_and_run(call.effect_key)
    assert loaded is not None
    assert (loaded[0].status, loaded[0].lost_times) == ("error", 3)
    assert loaded[0].result is not None and "was lost 3 times" in loaded[0].result
    assert worker.alive()


def test_a_call_past_the_hard_time_limit_three_times_ends_the_run(
    threads: Any, worker: WorkerProcess, killer_dir: Path
) -> None:
    handle = threads.start("past_the_limit", "go")
    run = eventually(lambda: _ended(threads, handle.run_id), timeout=DEADLINE_S, what="the run to end")
    assert run.status == "error", run
    assert run.error is not None and "stubborn" in run.error and "was lost 3 times" in run.error, run.error
    assert _runs(killer_dir, "stubborn") == 3
    assert worker.alive()


def test_a_step_that_kills_its_worker_ends_the_run_after_three_losses(
    threads: Any, worker: WorkerProcess, killer_dir: Path
) -> None:
    handle = threads.start("dying_step", "go")
    run = eventually(lambda: _ended(threads, handle.run_id), timeout=DEADLINE_S, what="the run to end")
    assert run.status == "error", run
    assert run.error is not None and "model step 0" in run.error and "was lost 3 times" in run.error, run.error
    assert _runs(killer_dir, "dying_step") == 3
    assert (run.lost_step, run.lost_times) == (0, 3)
    assert worker.alive()


def test_after_the_killings_the_next_run_completes(threads: Any, worker: WorkerProcess) -> None:
    run = threads.wait(threads.start("survivor", "go").run_id, timeout=DEADLINE_S)
    assert (run.status, run.output) == ("completed", "still here")
