"""Chaos: the infrastructure goes away under running work, and nothing is lost or repeated.

* Redis restarted (``shutdown nosave``) with runs in flight and messages queued: the queued
  messages die with Redis, and publishes made while it is down fail; the outbox republish of the
  reconcile backbone brings every run to completion, each effect exactly once.
* PostgreSQL stopped with tools mid-call, and started again once a tool's result failed to
  commit: every pooled connection is cut; workers reconnect (``pool_pre_ping``, tasks retry on
  ``StoreUnavailable``), the executed call's result is committed when the store is back instead
  of being dropped, and every run completes, each effect exactly once.
* PostgreSQL crashed (an immediate shutdown: no checkpoint, the WAL not yet written is lost)
  under a stream of read_only results, whose commits do not wait for the disk: a crash takes the
  last of them back. What they had published finds the call before it unsettled and does
  nothing, the calls run again, and every run completes, its unguarded call exactly once.
* Two real ``celery beat`` processes at once, a whole worker SIGKILLed mid-call: the runs it held
  are recovered, and overlapping reconcile ticks park an unguarded call once, never run it twice
  and never record two results for one call.

The Redis and PostgreSQL restarted here are the session's own private instances
(``chaos_services`` in ``conftest.py``, on free ports): the machine's services are never touched.
Recovery comes from a real ``celery -A tasks beat``; they are always brought back up in a
``finally`` block.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.chaos import chaos_agents
from tests.support.processes import queued_messages
from tests.support.waiting import eventually
from threads_celery.transitions.runs import effect_key_for

if TYPE_CHECKING:  # the conftest is pytest's to import; tests only name its types
    from tests.chaos.conftest import BeatProcess, ChaosCluster, ChaosServices, WorkerProcess

SETTLE_S = 60.0
RESULT_COMMIT_FAILED = "cannot commit its result yet"  # threads_celery.runtime.machine, riding out an outage
PUBLISH_FAILED = "left for the reconcile backbone"  # threads_celery.transitions.publishing.Publisher's warning

# Every class of effect, plus a reply with two calls. Without kills, nothing needs a rerun.
MIX = [
    "read_only",
    "idempotent",
    "idempotent_tiny",
    "reconcilable",
    "reconcilable_nonfinal",
    "unguarded",
    "unguarded",
]


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def workers(cluster: ChaosCluster) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(count: int = 2, **env: str) -> list[WorkerProcess]:
        new = cluster.start_workers(count, **env)
        started.extend(new)
        return new

    yield start  # type: ignore[misc]
    for worker in started:
        worker.kill()


@pytest.fixture
def beat(cluster: ChaosCluster) -> Iterator[BeatProcess]:
    """The reconcile backbone: a real Beat, ticking every 0.5 s."""
    process = cluster.start_beat()
    yield process
    process.kill()


def services(cluster: ChaosCluster) -> ChaosServices:
    assert cluster.services is not None
    return cluster.services


def start_mix(cluster: ChaosCluster, seconds: float) -> list[tuple[Any, str]]:
    """One run per entry of MIX plus a two-call run; returns (handle, ref) pairs."""
    started = []
    for effect_class in MIX:
        ref = uuid.uuid4().hex[:12]
        handle = cluster.threads.start(chaos_agents.AGENTS[effect_class], chaos_agents.message(ref, seconds=seconds))
        started.append((handle, ref))
    ref = uuid.uuid4().hex[:12]
    started.append(
        (
            cluster.threads.start(chaos_agents.mixed_agent, chaos_agents.message(ref, seconds=seconds)),
            ref,
        )
    )
    return started


def calls_of(cluster: ChaosCluster, thread_id: str) -> list[Any]:
    """The tool calls the model asked for in a thread (with their effect keys)."""
    return [c for m in cluster.threads.messages(thread_id) if m.role == "assistant" for c in m.tool_calls]


def assert_completed_exactly_once(cluster: ChaosCluster, started: list[tuple[Any, str]]) -> None:
    """Every run completed, each non-read_only effect happened exactly once, one result per call."""
    settled = [cluster.wait_settled(handle.run_id, SETTLE_S) for handle, _ in started]
    counts = cluster.ledger.effect_counts()
    for (handle, _), run in zip(started, settled, strict=True):
        assert run.status == "completed", f"run {run.id} ({run.agent}) is {run.status}: {run.error}"
        calls = calls_of(cluster, handle.thread_id)
        assert calls, f"run {run.id} asked for no tool call"
        results = Counter(r.call_id for r in cluster.tool_results(handle.thread_id))
        for c in calls:
            assert results[c.id] == 1, f"{c.name} ({c.effect_key}) has {results[c.id]} results"
            effect_class = chaos_agents.EFFECT_CLASS_OF_TOOL[c.name]
            if effect_class == "read_only":
                assert counts[c.effect_key] >= 1
            else:
                assert counts[c.effect_key] == 1, f"{c.name} ({c.effect_key}) ran {counts[c.effect_key]} times"


def wait_for_running_tools(cluster: ChaosCluster, started: list[tuple[Any, str]], count: int) -> None:
    """Wait until ``count`` calls of these runs have started (every pool process is busy)."""
    refs = {ref for _, ref in started}

    def running() -> int:
        return len({e.effect_key for e in cluster.ledger.starts() if e.ref in refs})

    eventually(lambda: running() >= count, timeout=SETTLE_S, what=f"{count} tools running")


def queue_length(cluster: ChaosCluster) -> int:
    return queued_messages(cluster.broker_url)


# -- 5. Redis restarted mid-run ------------------------------------------------------------------


def test_redis_restart_mid_run_loses_nothing(cluster: ChaosCluster, workers: Any, beat: BeatProcess) -> None:
    running = workers(2)
    redis_server = services(cluster).redis
    before = cluster.backbone_totals()
    started = start_mix(cluster, seconds=1.5)
    # Four tools mid-call (both workers busy) and messages still waiting in Redis.
    wait_for_running_tools(cluster, started, 4)
    queued = queue_length(cluster)
    assert queued >= 1, "the test needs messages queued in Redis when it goes down"
    try:
        redis_server.stop()  # SHUTDOWN NOSAVE: every queued message is gone
        # Stay down until a tool finished while Redis was gone and its next task's publish
        # failed (the Publisher leaves the row to the backbone).
        eventually(
            lambda: any(PUBLISH_FAILED in w.log_text() for w in running),
            timeout=30,
            what="a publish failing during the outage",
        )
    finally:
        redis_server.start()

    assert_completed_exactly_once(cluster, started)
    assert cluster.backbone_totals()["republished"] > before["republished"], (
        "the lost messages come back through the outbox"
    )


# -- 6. PostgreSQL restarted mid-run -------------------------------------------------------------


def test_postgres_restart_mid_run_loses_nothing(cluster: ChaosCluster, workers: Any, beat: BeatProcess) -> None:
    # Leases longer than the restart, so a worker that keeps working through it keeps its calls:
    # the point here is reconnecting, not lease expiry (that is what the kill tests are for).
    running = workers(2, THREADS_TOOL_LEASE_S="8", THREADS_STEP_LEASE_S="8")
    postgres = services(cluster).postgres
    # Two waves of tools: the first finishes (and commits) while the database is down.
    started = start_mix(cluster, seconds=1.0) + start_mix(cluster, seconds=1.0)
    wait_for_running_tools(cluster, started, 4)
    try:
        postgres.stop("fast")
        # Stay down until a tool finished mid-outage and could not commit its result.
        eventually(
            lambda: any(RESULT_COMMIT_FAILED in w.log_text() for w in running),
            timeout=30,
            what="a tool result failing to commit during the outage",
        )
    finally:
        postgres.start()
    ticks_before = cluster.backbone_totals()["ticks"]

    assert_completed_exactly_once(cluster, started)
    eventually(
        lambda: cluster.backbone_totals()["ticks"] > ticks_before,
        timeout=SETTLE_S,
        what="a tick after the restart",
    )


def test_postgres_crash_under_read_only_results_loses_nothing(
    cluster: ChaosCluster, workers: Any, beat: BeatProcess
) -> None:
    running = workers(2, THREADS_TOOL_LEASE_S="8", THREADS_STEP_LEASE_S="8")
    postgres = services(cluster).postgres
    started = []
    for _ in range(150):
        ref = uuid.uuid4().hex[:12]
        started.append((cluster.threads.start(chaos_agents.reads_agent, chaos_agents.message(ref)), ref))
    refs = {ref for _, ref in started}

    def reads_done() -> int:
        return sum(1 for e in cluster.ledger.effects() if e.ref in refs and e.tool == "fetch_quote")

    eventually(lambda: reads_done() >= 100, timeout=SETTLE_S, what="read_only results streaming in")
    try:
        postgres.stop("immediate")
    finally:
        postgres.start()
    assert reads_done() < 4 * len(started), "every run had finished before the crash"

    assert_completed_exactly_once(cluster, started)
    logs = "".join(w.log_text() for w in running)
    print(
        "deliveries published by a taken-back result, skipped:",
        logs.count("the call before it in its reply has not settled"),
        "calls,",
        logs.count("a call of the step before has not settled"),
        "steps",
    )


# -- 7. two Beats at once, a whole worker killed ---------------------------------------------------

AFTER_WHOLE_KILL = {  # effect class -> (status, effect count) for a run the killed worker held
    "read_only": ("completed", 2),
    "idempotent": ("completed", 2),
    "reconcilable": ("completed", 1),
    "unguarded": ("parked", 1),
}


def test_two_beats_recover_a_killed_worker_once(cluster: ChaosCluster, workers: Any) -> None:
    first, second = workers(2)
    beats = [cluster.start_beat(wait=False), cluster.start_beat(wait=False)]
    try:
        for beat in beats:
            beat.wait_ready()
        _two_beats_scenario(cluster, workers, first, second, beats)
    finally:
        for beat in beats:
            beat.kill()


def _two_beats_scenario(
    cluster: ChaosCluster,
    workers: Any,
    first: WorkerProcess,
    second: WorkerProcess,
    beats: list[Any],
) -> None:
    runs: dict[str, tuple[Any, str, str]] = {}
    for effect_class in AFTER_WHOLE_KILL:
        ref = uuid.uuid4().hex[:12]
        handle = cluster.threads.start(chaos_agents.AGENTS[effect_class], chaos_agents.message(ref, seconds=4.0))
        runs[effect_class] = (handle, effect_key_for(handle.run_id, 0, 0), ref)
    lines = {cls: cluster.ledger.wait_for_line("effect", key, timeout=SETTLE_S) for cls, (_, key, _) in runs.items()}

    victim = cluster.worker_running(lines["unguarded"].pid, [first, second])
    victim_pids = set(victim.child_pids())
    victim.kill()
    replacement = workers(1)[0]

    for effect_class, (handle, key, _ref) in runs.items():
        run = cluster.wait_settled(handle.run_id, SETTLE_S)
        held_by_victim = lines[effect_class].pid in victim_pids
        status, count = AFTER_WHOLE_KILL[effect_class] if held_by_victim else ("completed", 1)
        assert run.status == status, f"{effect_class} (on the killed worker: {held_by_victim}) is {run.status}"
        assert cluster.ledger.effect_count(key) == count, f"{effect_class}: {cluster.ledger.effects(key)}"
        results = Counter(r.call_id for r in cluster.tool_results(handle.thread_id))
        assert all(n == 1 for n in results.values()), f"{effect_class}: duplicate tool results {results}"
        assert len(results) == (0 if status == "parked" else 1)

    unguarded_key = runs["unguarded"][1]
    logs = "".join(w.log_text() for w in (first, second, replacement))
    assert len(re.findall(rf"parked at call {re.escape(unguarded_key)} ", logs)) == 1, "parked more than once"
    for beat in beats:
        assert "Sending due task threads-reconcile" in beat.log_text(), f"{beat.name} never scheduled a tick"
