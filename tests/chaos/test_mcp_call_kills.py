"""Chaos: a worker's pool process is SIGKILLed in the middle of an MCP call.

The MCP test server records each call (with the pid of the process calling it) and, the first
time, stays busy until that process dies. The test kills it; Celery requeues the task
(``acks_late`` + ``reject_on_worker_lost``), the redelivery waits for the call's lease, and the
call's effect decides, as for any tool: read_only runs again, idempotent runs again inside its
window, unguarded parks for a person. The server's ledger is what really happened.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.waiting import eventually
from threads_celery.transitions.runs import effect_key_for

if TYPE_CHECKING:
    from tests.chaos.conftest import ChaosCluster, WorkerProcess

SETTLE_S = 60.0
AGENTS = "tests.chaos.chaos_agents,tests.chaos.mcp_chaos_agents"


@pytest.fixture(scope="module")
def mcp_ledger(cluster: ChaosCluster) -> Iterator[Path]:
    import os

    path = cluster.directory / "mcp-effects.log"
    saved = os.environ.get("MCP_TEST_LEDGER")
    os.environ["MCP_TEST_LEDGER"] = str(path)  # read when mcp_chaos_agents is imported, here too
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("MCP_TEST_LEDGER", None)
        else:
            os.environ["MCP_TEST_LEDGER"] = saved


@pytest.fixture(scope="module")
def workers(cluster: ChaosCluster, mcp_ledger: Path) -> list[WorkerProcess]:
    return cluster.start_workers(2, THREADS_AGENTS=AGENTS, MCP_TEST_LEDGER=str(mcp_ledger))


def _lines(ledger: Path, effect: str) -> list[str]:
    text = ledger.read_text() if ledger.exists() else ""
    return [line for line in text.splitlines() if line.startswith(f"slow_once {effect} ")]


def _caller_of_first_call(ledger: Path, effect: str) -> int:
    lines = eventually(
        lambda: _lines(ledger, effect),
        timeout=SETTLE_S,
        what=f"the {effect} call reaching the MCP server",
        interval=0.05,
    )
    found = re.search(r"caller=(\d+)", lines[0])
    assert found is not None, lines[0]
    return int(found.group(1))


@pytest.mark.parametrize(
    ("effect", "status", "calls"),
    [("read_only", "completed", 2), ("idempotent", "completed", 2), ("unguarded", "parked", 1)],
)
def test_an_mcp_call_interrupted_by_a_worker_kill_recovers_by_its_effect(
    cluster: ChaosCluster,
    workers: list[WorkerProcess],
    mcp_ledger: Path,
    effect: str,
    status: str,
    calls: int,
) -> None:
    from tests.chaos import mcp_chaos_agents

    agent = mcp_chaos_agents.AGENTS[effect]
    cluster.threads.register(agent)
    handle = cluster.threads.start(agent, "go")
    caller = _caller_of_first_call(mcp_ledger, effect)
    cluster.worker_running(caller, workers).kill_child(caller)

    run = cluster.wait_status(handle.run_id, status, SETTLE_S)

    lines = _lines(mcp_ledger, effect)
    assert len(lines) == calls, lines
    key = effect_key_for(handle.run_id, 0, 0)
    if status == "completed":
        assert f"caller={caller}" not in lines[1]  # another process ran it again
        [result] = cluster.tool_results(handle.thread_id)
        assert result.content == f"done {effect}"
        assert run.output == "done"
    else:
        [pending] = [p for p in cluster.threads.parked() if p.effect_key == key]
        assert pending.status == "parked" and "unguarded" in pending.reason
