"""A worker freezes what its start-up made, so that a full garbage collection in a pool process
never walks the imported modules and the runtime (tens of milliseconds to a second with the GIL
held, in which no live delta is published and no step commits).

A tool on a real worker reports the collector's frozen count of the process it runs in: on a
prefork pool that is a forked child (the parent froze its heap before forking), on a threads
pool the worker's own process. ``Threads.embedded()`` runs in the user's process and leaves its
collector alone (tests/unit/worker/test_embedded_heap.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import registered_client
from tests.support.processes import REPO_ROOT, WorkerProcess, subprocess_env

pytestmark = pytest.mark.integration

WAIT_S = 60.0

AGENTS_MODULE = """
import gc
import json
import os
from pathlib import Path

from pydantic import BaseModel

from threads_celery import Agent, tool
from threads_celery.testing import ScriptedModel, call, say


class Nothing(BaseModel):
    pass


def _heap(inp: Nothing, ctx: object) -> str:
    report = {"frozen": gc.get_freeze_count(), "pid": os.getpid()}
    Path(os.environ["HEAP_REPORT"]).write_text(json.dumps(report))
    return "reported"


heap = tool(name="heap", description="Report the collector.", input=Nothing, effect="read_only", execute=_heap)

reports_heap = Agent(
    name="it_reports_heap",
    instructions="Report the heap.",
    model=ScriptedModel([call("heap"), say("reported")]),
    tools=[heap],
)
"""


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_the_process_running_a_tool_has_its_start_up_frozen(
    pool: str, migrated_pg_url: str, integration_redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "heap_agents.py").write_text(AGENTS_MODULE)
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": "heap_agents",
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}",
            "HEAP_REPORT": str(tmp_path / "heap.json"),
        }
    )
    worker = WorkerProcess(f"heap-{pool}", env=env, log_path=tmp_path / "worker.log", concurrency=1, pool=pool)
    sys.path.insert(0, str(tmp_path))
    try:
        import heap_agents  # type: ignore[import-not-found]

        agent = heap_agents.reports_heap
        with worker.running(), registered_client(migrated_pg_url, integration_redis_url, [agent]) as threads:
            handle = threads.start(agent, "report")
            run: Any = threads.wait(handle.run_id, WAIT_S)
            assert run.status == "completed", worker.log_tail()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("heap_agents", None)
    report = json.loads((tmp_path / "heap.json").read_text())
    assert report["frozen"] > 10_000, report  # the modules and the runtime, not a handful
    assert report["pid"] != os.getpid()
