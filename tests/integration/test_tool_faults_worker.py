"""Nothing a tool, a hook or a dependency factory raises can hurt a real prefork worker.

A prefork worker (2 pool processes, PostgreSQL ledger, Redis broker) runs tools that raise a
``BaseException`` needing constructor arguments (it cannot be unpickled in the main process, which
used to die of it), ``SystemExit``, ``KeyboardInterrupt``, one whose ``__str__``, ``__repr__`` and
``__reduce__`` all raise, and a plain ``BaseException``, sync and async; an agent whose deciding hook
and observing hook raise such things; one whose context hook calls ``sys.exit``; and a Pydantic AI
agent whose dependency factory does. For each: the run ends truthfully (a tool error the model saw
and went on from, a denied call, or the run in error saying why), the tool ran exactly once, the
worker's main process and its pool processes are the ones it started with, and a next run completes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import registered_client
from tests.support.processes import WorkerProcess, subprocess_env
from tests.support.waiting import eventually

AGENTS = "tests.integration.fault_agents"
DEADLINE_S = 60.0
# What the worker's log would show had a fault reached the main process or killed a pool process.
FATAL_LINES = ("Unrecoverable error", "WorkerLostError", "exited with 'signal", "exited with 'exitcode")


@pytest.fixture(scope="module")
def faults_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def worker(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory, faults_dir: Path
) -> Iterator[WorkerProcess]:
    env = subprocess_env({
        "THREADS_DATABASE_URL": migrated_pg_url, "THREADS_BROKER_URL": integration_redis_url,
        "THREADS_AGENTS": AGENTS, "TOOL_FAULTS_DIR": str(faults_dir),
    })  # fmt: skip
    process = WorkerProcess(
        "faults-w1", env=env, log_path=tmp_path_factory.mktemp("worker") / "faults-w1.log", concurrency=2
    )
    with process.running():
        yield process


@pytest.fixture(scope="module")
def threads(worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str) -> Iterator[Any]:
    from tests.integration.fault_agents import ALL_AGENTS

    with registered_client(migrated_pg_url, integration_redis_url, ALL_AGENTS) as client:
        yield client


@pytest.fixture(scope="module")
def pool_at_start(worker: WorkerProcess) -> tuple[int, list[int]]:
    pool = eventually(worker.child_pids, timeout=DEADLINE_S, what="the worker's pool processes")
    return worker.pid, pool


def _calls(faults_dir: Path, tool_name: str) -> int:
    path = faults_dir / f"{tool_name}.calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _assert_worker_unhurt(worker: WorkerProcess, pool_at_start: tuple[int, list[int]]) -> None:
    main_pid, pool = pool_at_start
    assert worker.alive() and worker.pid == main_pid, "the worker's main process died"
    assert worker.child_pids() == pool, "a pool process was lost and replaced"
    log = worker.log_text()
    assert [line for line in log.splitlines() if any(fatal in line for fatal in FATAL_LINES)] == []


TOOLS = [
    ("needs_arguments", "NeedsArguments"),
    ("system_exit", "SystemExit"),
    ("keyboard_interrupt", "KeyboardInterrupt"),
    ("hostile", "Hostile"),
    ("plain_base", "BaseException"),
    ("async_needs_arguments", "NeedsArguments"),
    ("async_system_exit", "SystemExit"),
    ("async_hostile", "Hostile"),
]


@pytest.mark.parametrize(("tool_name", "type_name"), TOOLS)
def test_a_tool_raising_it_is_a_tool_error_and_the_worker_stays_up(
    threads: Any,
    worker: WorkerProcess,
    pool_at_start: tuple[int, list[int]],
    faults_dir: Path,
    tool_name: str,
    type_name: str,
) -> None:
    handle = threads.start(f"fault_{tool_name}", "go")
    run = threads.wait(handle.run_id, timeout=DEADLINE_S)
    assert (run.status, run.output) == ("completed", f"after {tool_name}"), run.error
    results = [m.tool_result for m in threads.messages(handle.thread_id) if m.role == "tool"]
    assert len(results) == 1 and results[0].is_error and type_name in results[0].content, results
    assert _calls(faults_dir, tool_name) == 1
    _assert_worker_unhurt(worker, pool_at_start)


def test_hooks_that_raise_deny_the_call_and_are_ignored_when_observing(
    threads: Any, worker: WorkerProcess, pool_at_start: tuple[int, list[int]], faults_dir: Path
) -> None:
    handle = threads.start("fault_hooked", "go")
    run = threads.wait(handle.run_id, timeout=DEADLINE_S)
    assert (run.status, run.output) == ("completed", "after the hook"), run.error
    results = [m.tool_result for m in threads.messages(handle.thread_id) if m.role == "tool"]
    assert len(results) == 1 and results[0].content.startswith("denied:") and "Hostile" in results[0].content
    assert _calls(faults_dir, "hooked_echo") == 0  # a deciding hook that fails, fails closed
    eventually(
        lambda: "observing hook on_stop failed and was ignored: Hostile" in worker.log_text(),
        timeout=DEADLINE_S,
        what="the on_stop hook's failure logged",
    )
    _assert_worker_unhurt(worker, pool_at_start)


def test_a_context_hook_calling_sys_exit_ends_the_run_in_error(
    threads: Any, worker: WorkerProcess, pool_at_start: tuple[int, list[int]]
) -> None:
    run = threads.wait(threads.start("fault_step_hook", "go").run_id, timeout=DEADLINE_S)
    assert run.status == "error" and "before_step" in (run.error or "") and "SystemExit" in (run.error or ""), run.error
    _assert_worker_unhurt(worker, pool_at_start)


def test_a_deps_factory_calling_sys_exit_ends_the_run_in_error(
    threads: Any, worker: WorkerProcess, pool_at_start: tuple[int, list[int]]
) -> None:
    run = threads.wait(threads.start("fault_deps", "go").run_id, timeout=DEADLINE_S)
    assert run.status == "error" and "SystemExit" in (run.error or "") and "the factory quit" in (run.error or ""), (
        run.error
    )
    _assert_worker_unhurt(worker, pool_at_start)


def test_after_every_fault_the_next_runs_complete(
    threads: Any, worker: WorkerProcess, pool_at_start: tuple[int, list[int]]
) -> None:
    # Ordered last in this module: it runs after each fault above. Four at once, so both pool
    # processes take work.
    handles = [threads.start("fault_next", f"go {i}") for i in range(4)]
    for handle in handles:
        run = threads.wait(handle.run_id, timeout=DEADLINE_S)
        assert (run.status, run.output) == ("completed", "next run done"), run.error
    _assert_worker_unhurt(worker, pool_at_start)
