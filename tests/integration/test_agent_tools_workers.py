"""Agents as tools on PostgreSQL, with real ``celery -A tasks worker`` subprocesses.

* Races on the real ledger (no worker; the broker is the in-process memory transport, so nothing
  consumes what is published): two deliveries of one finish at once fire the hooks once; two
  launches at once past a cap of one refuse exactly one.
* Recovery: a worker is SIGKILLed (its whole process group) while a child agent-tool run works;
  a second worker and reconcile ticks finish the job. The parent collects the child's real
  result, and work that had finished (an idempotent tool writing files, counted in a file) is not
  done again. The parent's event log read live and replayed after a cursor are identical.

The worker loads ``tests.support.agent_tool_agents`` and uses a Redis database of its own
(``THREADS_TEST_AGENT_TOOLS_REDIS_DB``, default 13), flushed first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.agent_tool_agents import RecordingParent, quick_child, unique
from tests.support.clients import registered_client
from tests.support.processes import WorkerProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery import Detached, Settings, Threads
from threads_celery.runtime.machine import Runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_AGENTS = "tests.support.agent_tool_agents"
WAIT_S = 90.0
RACES = 5


class CappedParent(RecordingParent):
    max_concurrent_agent_tools = 1


# -- races on the ledger (no worker) ---------------------------------------------------------


@pytest.fixture
def ledger_threads(migrated_pg_url: str) -> Iterator[Threads]:
    """A client on PostgreSQL whose tasks nobody consumes: the test drives every step itself."""
    client = Threads(database_url=migrated_pg_url, broker_url="memory://", settings=Settings(model_retries=0))
    try:
        yield client
    finally:
        client.close()


def race(*calls: Any) -> list[Any]:
    """Run the calls on threads of their own, released at the same moment."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    if errors:
        raise errors[0]
    return results


def test_two_concurrent_deliveries_of_one_finish_fire_on_finish_and_the_global_hook_once(
    ledger_threads: Threads,
) -> None:
    client = ledger_threads
    parent = RecordingParent(unique("pg_parent"))
    parent_thread = client.start(parent, "hello").thread_id  # nobody runs it: the thread just exists
    child = quick_child("finished on postgres")
    first = Runtime(client.store, client.registry, publish=client.publisher, worker_id="worker-a")
    second = Runtime(client.store, client.registry, publish=client.publisher, worker_id="worker-b")
    for _ in range(RACES):
        handle = client.run_agent_tool(parent_thread, child, input="x", detached=Detached(on_finish="on_done"))
        row = client.inspect_agent_tool_run(handle.run_id)
        assert first.run_step(row.child_run_id, 0) == "completed"
        assert client.inspect_agent_tool_run(handle.run_id).status == "completed"

        run_id = handle.run_id
        outcomes = race(lambda: first.deliver(run_id, "completed"), lambda: second.deliver(run_id, "completed"))  # noqa: B023 - raced now
        assert sorted(o.split(":")[0] for o in outcomes) == ["delivered completed", "skipped"], outcomes
        assert client.inspect_agent_tool_run(handle.run_id).delivered == ("completed",)
        assert [r for r, _ in parent.done].count(handle.run_id) == 1
        assert parent.finishes.count((handle.run_id, "completed")) == 1
    assert len(parent.done) == RACES
    assert all(result.summary == "finished on postgres" for _, result in parent.done)


def test_two_launches_at_once_past_a_cap_of_one_refuse_exactly_one_on_postgres(ledger_threads: Threads) -> None:
    client = ledger_threads
    parent = CappedParent(unique("pg_capped"))
    child = quick_child()
    for _ in range(RACES):
        parent_thread = client.start(parent, "hello").thread_id
        handles = race(
            lambda: client.run_agent_tool(parent_thread, child, input="a", detached=True),  # noqa: B023 - raced now
            lambda: client.run_agent_tool(parent_thread, child, input="b", detached=True),  # noqa: B023 - raced now
        )
        assert sorted(h.status for h in handles) == ["error", "running"], handles
        rows = client.agent_tool_runs(parent_thread)
        assert sorted(r.status for r in rows) == ["error", "running"]
        assert [r.child_thread_id is None for r in sorted(rows, key=lambda r: r.status)] == [True, False]


# -- recovery with real workers --------------------------------------------------------------


@pytest.fixture
def worker_broker_url(redis_url: str) -> str:
    import redis

    raw_db = os.environ.get("THREADS_TEST_AGENT_TOOLS_REDIS_DB", "13")
    if not raw_db.isdigit() or not 1 <= int(raw_db) <= 15:
        pytest.fail(f"THREADS_TEST_AGENT_TOOLS_REDIS_DB must be an integer in 1..15, got {raw_db!r}")
    parts = urlsplit(redis_url)
    client = redis.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=int(raw_db))
    try:
        client.flushdb()
    finally:
        client.close()
    return f"redis://{parts.hostname}:{parts.port}/{raw_db}"


@pytest.fixture
def start_worker(
    migrated_pg_url: str, worker_broker_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Any]:
    started: list[WorkerProcess] = []
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": worker_broker_url,
            "THREADS_AGENTS": WORKER_AGENTS,
            # A killed read_only call is taken over once its lease (2 s) runs out unrenewed.
            "THREADS_TOOL_LEASE_S": "2",
            "THREADS_STEP_LEASE_S": "5",
            "THREADS_OUTBOX_STALE_AFTER_S": "2",
        }
    )

    def start(name: str) -> WorkerProcess:
        worker = WorkerProcess(name, env=env, log_path=tmp_path / f"{name}.log")
        worker.start()
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    failed = getattr(request.node, "_report_call", None)
    for worker in started:
        if failed is not None and failed.failed:
            print(f"--- last lines of worker {worker.name} ---\n{worker.log_tail()}")
        worker.terminate()


@pytest.fixture
def worker_client(migrated_pg_url: str, worker_broker_url: str) -> Iterator[Threads]:
    from tests.support import agent_tool_agents

    settings = Settings(tool_lease_s=2, step_lease_s=5, outbox_stale_after_s=2)
    with registered_client(
        migrated_pg_url, worker_broker_url, agent_tool_agents.ALL_AGENTS, settings=settings
    ) as client:
        yield client


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_parent_collects_its_childs_real_result_after_a_worker_is_killed_mid_child(
    start_worker: Any, worker_client: Threads, tmp_path: Path
) -> None:
    client = worker_client
    workdir = tmp_path / "work"
    workdir.mkdir()
    first = start_worker("at1")
    handle = client.start("at_delegating_parent", f"work {workdir}")

    live: list[Any] = []
    finished = threading.Event()

    def follow() -> None:
        for event in client.events(handle.thread_id, follow=True, timeout=WAIT_S * 2):
            live.append(event)
            if (
                event.type == "run"
                and event.payload.get("run_id") == handle.run_id
                and event.payload.get("status") == "completed"
            ):
                break
        finished.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()

    # The child wrote its files (a finished, committed step) and now waits at the gate.
    eventually(lambda: lines(workdir / "gate.entered"), timeout=WAIT_S, what="the child to reach the gate")
    assert len(lines(workdir / "writes.log")) == 1
    [row] = client.agent_tool_runs(handle.thread_id)
    assert row.status == "running" and client.get_run(handle.run_id).status == "waiting"

    first.kill()
    (workdir / "gate").touch()
    start_worker("at2")

    def parent_done() -> bool:
        client.reconcile()  # the backbone, as Beat would tick it
        return client.get_run(handle.run_id).status in ("completed", "error", "aborted")

    eventually(parent_done, timeout=WAIT_S, what="the parent to finish after the kill")
    run = client.get_run(handle.run_id)
    assert run.status == "completed", run.error
    child_summary = "wrote the files and passed the gate"
    assert run.output == f"the writer said: {child_summary}"
    tool_messages = [m for m in client.messages(handle.thread_id) if m.role == "tool"]
    assert [m.text for m in tool_messages] == [child_summary]  # the child's real result, once

    # Finished work was not done again; the unfinished read_only wait ran again after the kill.
    assert len(lines(workdir / "writes.log")) == 1
    assert len(lines(workdir / "gate.entered")) >= 2
    [row] = client.agent_tool_runs(handle.thread_id)
    assert (row.status, row.summary, row.delivered, row.reason) == ("completed", child_summary, ("completed",), None)
    child_messages = client.messages(row.child_thread_id)
    assert [m.tool_result.name for m in child_messages if m.tool_result] == ["write_files", "wait_for_gate"]
    child_runs = [
        r for r in client.runs(limit=1000) if r.agent == "at_writer_child" and r.thread_id == row.child_thread_id
    ]
    assert [r.status for r in child_runs] == ["completed"]

    # The live read and a replay after a cursor give the same events, in the same order.
    assert finished.wait(WAIT_S), "the live reader never saw the parent finish"
    follower.join(5)
    kinds = [e.type for e in live]
    assert kinds.count("agent_tool.started") == 1 and kinds.count("agent_tool.finished") == 1
    assert kinds.index("agent_tool.started") < kinds.index("agent_tool.finished")
    cursor = live[kinds.index("agent_tool.started")].seq
    replayed = list(client.events(handle.thread_id, after=cursor))
    as_tuples = lambda events: [(e.seq, e.type, e.payload) for e in events]  # noqa: E731
    assert as_tuples(replayed) == as_tuples([e for e in live if e.seq > cursor])
    assert as_tuples(client.events(handle.thread_id)) == as_tuples(live)
    assert [e.seq for e in live] == list(range(live[0].seq, live[0].seq + len(live)))  # no gaps
