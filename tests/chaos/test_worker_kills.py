"""Chaos: workers die (or freeze) in the middle of a tool call, and every effect class recovers as
its promise says.

Each test starts one run of a chaos agent whose tool records its effect in the side-effect ledger
and then sleeps; the test waits for that ledger line, then kills the process that wrote it (the
pid is in the line). The ledger is what really happened; the store is what the runtime believes.

* SIGKILL of the pool process (Celery requeues the task: ``acks_late`` + ``reject_on_worker_lost``):
  the redelivery waits for the run's lease, then the effect decides.
* SIGKILL of the whole worker, a second worker alive: Redis keeps the message unacked for the
  visibility timeout (an hour), so the run can only move on through the reconcile backbone: the
  module's real ``celery -A tasks beat`` process, as in a deployment.
* A crash between commit and publish: the outbox row is republished by the backbone.
* SIGSTOP past the lease, then SIGCONT: a second worker settles the call, and the frozen
  worker's late commit is refused by the fence.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.chaos import chaos_agents
from tests.support.waiting import eventually
from threads_celery.transitions.runs import effect_key_for

if TYPE_CHECKING:  # the conftest is pytest's to import; tests only name its types
    from tests.chaos.conftest import BeatProcess, ChaosCluster, WorkerProcess

CHAOS_ENV = {
    # Runs whose id starts like this crash the pool process that publishes the named message,
    # once, right after the transaction that recorded it committed.
    "CHAOS_CRASH_ON_PUBLISH": "step:run_crashstep_*:1,run_crashtool_*:0:0",
}
LONG = 30.0  # the first execution sleeps this long: the test kills it long before it ends
SETTLE_S = 30.0  # a run must settle within this (leases are 2 s; the broker's redelivery is 1 h)
PRINCIPAL = "chaos-test"


@pytest.fixture(scope="module")
def workers(cluster: ChaosCluster) -> list[WorkerProcess]:
    return cluster.start_workers(2)


@pytest.fixture(scope="module")
def beat(cluster: ChaosCluster) -> BeatProcess:
    """The reconcile backbone for the whole module: a real Beat, ticking every 0.5 s."""
    return cluster.start_beat()


@pytest.fixture(autouse=True)
def healthy_workers(cluster: ChaosCluster, workers: list[WorkerProcess], beat: BeatProcess) -> list[WorkerProcess]:
    """Each test begins with two live, running workers (replacing any a previous test killed)
    and Beat ticking."""
    assert beat.alive(), f"Beat died:\n{beat.log_tail()}"
    for i, worker in enumerate(workers):
        if worker.stopped:
            worker.cont()
        if not worker.alive():
            workers[i] = cluster.start_worker(wait=False)
    for worker in workers:
        worker.wait_ready()
    return workers


def start(
    cluster: ChaosCluster,
    effect_class: str,
    *,
    seconds: float = LONG,
    sleep_first: bool = False,
    run_id: str | None = None,
) -> tuple[Any, str, str]:
    """Start one run of the effect class's agent; returns (handle, effect key, ref)."""
    ref = uuid.uuid4().hex[:12]
    handle = cluster.threads.start(
        chaos_agents.AGENTS[effect_class],
        chaos_agents.message(ref, seconds=seconds, sleep_first=sleep_first),
        run_id=run_id,
    )
    return handle, effect_key_for(handle.run_id, 0, 0), ref


def effects_of_ref(cluster: ChaosCluster, ref: str) -> list[Any]:
    return [e for e in cluster.ledger.effects() if e.ref == ref]


def only_tool_result(cluster: ChaosCluster, thread_id: str) -> Any:
    results = cluster.tool_results(thread_id)
    assert len(results) == 1, f"expected exactly one tool result, got {results}"
    return results[0]


def kill_child_running(cluster: ChaosCluster, workers: list[WorkerProcess], key: str, *, kind: str = "effect") -> int:
    """Wait for the call's ledger line, then SIGKILL the pool process that wrote it."""
    line = cluster.ledger.wait_for_line(kind, key, timeout=SETTLE_S)
    cluster.worker_running(line.pid, workers).kill_child(line.pid)
    return line.pid


def frozen_until_settled(
    cluster: ChaosCluster, workers: list[WorkerProcess], pid: int, run_id: str
) -> tuple[WorkerProcess, Any]:
    """SIGSTOP the worker whose pool process ``pid`` is, until the run settles elsewhere; SIGCONT.

    Returns the worker and the settled run."""
    frozen = cluster.worker_running(pid, workers)
    frozen.stop()
    try:
        run = cluster.wait_settled(run_id, SETTLE_S)
    finally:
        frozen.cont()
    return frozen, run


# -- 1. the pool process is SIGKILLed mid-call -------------------------------------------------


def test_child_kill_read_only_runs_again(cluster: ChaosCluster, healthy_workers: list[WorkerProcess]) -> None:
    handle, key, ref = start(cluster, "read_only")
    killed = kill_child_running(cluster, healthy_workers, key)

    run = cluster.wait_status(handle.run_id, "completed", SETTLE_S)

    effects = effects_of_ref(cluster, ref)
    assert [e.effect_key for e in effects] == [key, key]
    assert effects[0].pid == killed and effects[1].pid != killed
    assert only_tool_result(cluster, handle.thread_id).content == f"done:fetch_quote:{ref}"
    assert run.output == "done"


def test_child_kill_idempotent_runs_again_with_the_same_key(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    handle, key, ref = start(cluster, "idempotent")
    killed = kill_child_running(cluster, healthy_workers, key)

    cluster.wait_status(handle.run_id, "completed", SETTLE_S)

    effects = effects_of_ref(cluster, ref)
    assert [e.effect_key for e in effects] == [key, key], "the resend must carry the first attempt's key"
    assert effects[1].pid != killed
    assert [e.attempt for e in effects] == [1, 2]
    call = cluster.call(key)
    assert (call.status, call.attempt) == ("completed", 2)
    assert only_tool_result(cluster, handle.thread_id).content == f"done:charge_with_key:{ref}"


def test_child_kill_idempotent_outside_its_window_parks(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    handle, key, ref = start(cluster, "idempotent_tiny")
    kill_child_running(cluster, healthy_workers, key)

    cluster.wait_status(handle.run_id, "parked", SETTLE_S)

    assert len(effects_of_ref(cluster, ref)) == 1, "a resend outside the dedup window must not happen"
    call = cluster.call(key)
    assert call.status == "parked"
    assert "dedup window of 1 ms has passed" in (call.park_reason or "")
    pending = {p.effect_key: p for p in cluster.threads.parked()}
    assert key in pending and pending[key].reason == call.park_reason
    assert cluster.tool_results(handle.thread_id) == []


def test_child_kill_reconcilable_found_records_the_result_without_running_again(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    handle, key, ref = start(cluster, "reconcilable")
    kill_child_running(cluster, healthy_workers, key)

    cluster.wait_status(handle.run_id, "completed", SETTLE_S)

    assert len(effects_of_ref(cluster, ref)) == 1
    assert len(cluster.ledger.starts(key)) == 1, "the lookup settled it: the tool must not run again"
    assert only_tool_result(cluster, handle.thread_id).content == f"found:{key}"
    assert cluster.call(key).attempt == 1


def test_child_kill_reconcilable_before_its_effect_runs_again(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    # The tool sleeps *before* its effect: the kill lands before anything happened.
    handle, key, ref = start(cluster, "reconcilable", sleep_first=True)
    kill_child_running(cluster, healthy_workers, key, kind="start")

    cluster.wait_status(handle.run_id, "completed", SETTLE_S)

    assert len(cluster.ledger.starts(key)) == 2, "a final not-found proves it never happened: run it again"
    effects = effects_of_ref(cluster, ref)
    assert [e.effect_key for e in effects] == [key] and effects[0].attempt == 2
    assert only_tool_result(cluster, handle.thread_id).content == f"done:charge_checked:{ref}"


def test_child_kill_reconcilable_nonfinal_not_found_parks(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    handle, key, ref = start(cluster, "reconcilable_nonfinal", sleep_first=True)
    kill_child_running(cluster, healthy_workers, key, kind="start")

    cluster.wait_status(handle.run_id, "parked", SETTLE_S)

    assert effects_of_ref(cluster, ref) == []
    assert len(cluster.ledger.starts(key)) == 1
    assert "finality is nonfinal" in (cluster.call(key).park_reason or "")


def test_child_kill_unguarded_parks_then_assume_done_completes(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    handle, key, ref = start(cluster, "unguarded")
    kill_child_running(cluster, healthy_workers, key)

    cluster.wait_status(handle.run_id, "parked", SETTLE_S)
    assert "unguarded tool interrupted mid-call" in (cluster.call(key).park_reason or "")
    assert len(effects_of_ref(cluster, ref)) == 1

    cluster.threads.resolve(key, "assume_done", principal=PRINCIPAL)
    cluster.wait_status(handle.run_id, "completed", SETTLE_S)

    assert len(effects_of_ref(cluster, ref)) == 1, "assume_done must not run the tool"
    assert len(cluster.ledger.starts(key)) == 1
    assert only_tool_result(cluster, handle.thread_id).content == f"assumed done by {PRINCIPAL}"
    call = cluster.call(key)
    assert (call.resolution, call.resolved_by) == ("assume_done", PRINCIPAL)


def test_child_kill_unguarded_parks_then_assume_not_done_runs_it_again(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    handle, key, ref = start(cluster, "unguarded")
    kill_child_running(cluster, healthy_workers, key)
    cluster.wait_status(handle.run_id, "parked", SETTLE_S)

    cluster.threads.resolve(key, "assume_not_done", principal=PRINCIPAL)
    cluster.wait_status(handle.run_id, "completed", SETTLE_S)

    effects = effects_of_ref(cluster, ref)
    assert [e.effect_key for e in effects] == [key, key], "a person accepted the duplicate: it ran twice"
    assert only_tool_result(cluster, handle.thread_id).content == f"done:send_email:{ref}"
    assert cluster.call(key).resolution == "assume_not_done"


# -- 2. the whole worker is SIGKILLed mid-call, another worker is alive -------------------------

# effect class -> (final run status, effect count, tool result content or None)
AFTER_WHOLE_KILL = {
    "read_only": ("completed", 2, "done:fetch_quote:{ref}"),
    "idempotent": ("completed", 2, "done:charge_with_key:{ref}"),
    "reconcilable": ("completed", 1, "found:{key}"),
    "unguarded": ("parked", 1, None),
}


@pytest.mark.parametrize("effect_class", list(AFTER_WHOLE_KILL))
def test_whole_worker_kill_recovers_through_the_backbone(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess], effect_class: str
) -> None:
    status, count, content = AFTER_WHOLE_KILL[effect_class]
    before = cluster.backbone_totals()
    handle, key, ref = start(cluster, effect_class)
    line = cluster.ledger.wait_for_line("effect", key, timeout=SETTLE_S)
    victim = cluster.worker_running(line.pid, healthy_workers)
    victim.kill()

    # Redis would hand the victim's unacked message out again only after an hour.
    run = cluster.wait_settled(handle.run_id, SETTLE_S)
    after = cluster.backbone_totals()

    assert run.status == status, f"{effect_class}: run is {run.status} ({run.error})"
    effects = effects_of_ref(cluster, ref)
    assert [e.effect_key for e in effects] == [key] * count
    assert all(e.pid != line.pid for e in effects[1:]), "the rerun ran on the surviving worker"
    if content is None:
        assert cluster.tool_results(handle.thread_id) == []
        assert "unguarded tool interrupted mid-call" in (cluster.call(key).park_reason or "")
    else:
        assert only_tool_result(cluster, handle.thread_id).content == content.format(ref=ref, key=key)
    # Beat's ticks moved it: a run lease expired (claimed calls) or an outbox row was due (read_only).
    moved = (after["expired_runs"] - before["expired_runs"]) + (after["republished"] - before["republished"])
    assert moved >= 1, (before, after)


# -- 3. a crash between commit and publish -------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "lost_key"),
    [
        ("run_crashstep", "step:{run_id}:1"),  # the tool's result committed, step 1 never published
        (
            "run_crashtool",
            "{run_id}:0:0",
        ),  # step 0 committed the call, the tool task never published
    ],
    ids=["after-tool-result", "after-model-step"],
)
def test_crash_between_commit_and_publish_is_recovered_by_the_outbox(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess], prefix: str, lost_key: str
) -> None:
    run_id = f"{prefix}_{uuid.uuid4().hex}"
    lost = lost_key.format(run_id=run_id)
    marker = cluster.marker_dir / chaos_agents.crash_marker_name(lost)
    handle, _key, ref = start(cluster, "unguarded", seconds=0.0, run_id=run_id)

    # The publishing pool process killed itself just before the message left...
    _wait_for_file(marker)
    # ...after the transaction that recorded the message committed: the row waits in the outbox.
    assert lost in cluster.outbox_keys()
    assert cluster.get_run(run_id).status == "running"

    before = cluster.backbone_totals()
    cluster.wait_status(run_id, "completed", SETTLE_S)

    assert cluster.backbone_totals()["republished"] > before["republished"], "Beat's tick republished the row"
    assert len(effects_of_ref(cluster, ref)) == 1, "the unguarded effect must happen exactly once"
    assert only_tool_result(cluster, handle.thread_id).content == f"done:send_email:{ref}"
    assert lost not in cluster.outbox_keys()


def _wait_for_file(path: Path, timeout: float = SETTLE_S) -> None:
    eventually(path.exists, timeout=timeout, what=f"{path} appearing", interval=0.02)


# -- 4. a worker frozen past its lease, then resumed ------------------------------------------

# effect class -> (status once the second worker settled it, effect count, tool result or None)
AFTER_FREEZE = {
    "read_only": ("completed", 2, "done:fetch_quote:{ref}"),
    "idempotent": ("completed", 2, "done:charge_with_key:{ref}"),
    "reconcilable": ("completed", 1, "found:{key}"),
    "unguarded": ("parked", 1, None),
}


@pytest.mark.parametrize("effect_class", list(AFTER_FREEZE))
def test_frozen_worker_is_fenced_off_when_it_resumes(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess], effect_class: str
) -> None:
    status, count, content = AFTER_FREEZE[effect_class]
    # The first execution sleeps 3 s, longer than the 2 s lease: it wakes after the other worker
    # settled the call, and tries to commit its own result.
    handle, key, ref = start(cluster, effect_class, seconds=3.0)
    line = cluster.ledger.wait_for_line("effect", key, timeout=SETTLE_S)
    frozen, run = frozen_until_settled(cluster, healthy_workers, line.pid, handle.run_id)
    assert run.status == status, f"{effect_class}: run is {run.status} ({run.error})"

    # The frozen worker wakes up, finishes its call and tries to commit: the fence refuses it.
    frozen.wait_for_log(
        rf"Task threads\.tool \S+\[{re.escape(key)}~[0-9a-f]{{8}}\] succeeded in [^:]*: 'fence lost'",
        timeout=SETTLE_S,
        what="the late commit being refused",
    )
    assert cluster.get_run(handle.run_id).status == status
    effects = effects_of_ref(cluster, ref)
    assert [e.effect_key for e in effects] == [key] * count
    results = cluster.tool_results(handle.thread_id)
    if content is None:
        assert results == [], "the frozen worker's late result must not be recorded"
        cluster.threads.resolve(key, "assume_done", principal=PRINCIPAL)
        cluster.wait_status(handle.run_id, "completed", SETTLE_S)
        assert [r.content for r in cluster.tool_results(handle.thread_id)] == [f"assumed done by {PRINCIPAL}"]
    else:
        assert [r.content for r in results] == [content.format(ref=ref, key=key)]


def test_a_worker_frozen_before_a_reconcilable_effect_does_not_make_it_when_resumed(
    cluster: ChaosCluster, healthy_workers: list[WorkerProcess]
) -> None:
    """Frozen after the call started but before its effect, past the lease: the lookup finds
    nothing and the call runs again on the other worker. Resumed, the first execution must be
    left where it stopped: one effect in all, and its task ends as a lost fence."""
    # The first execution waits 3 s before its effect; the other worker's runs it at once.
    handle, key, ref = start(cluster, "reconcilable", seconds=3.0, sleep_first=True)
    line = cluster.ledger.wait_for_line("start", key, timeout=SETTLE_S)
    frozen, run = frozen_until_settled(cluster, healthy_workers, line.pid, handle.run_id)
    assert run.status == "completed", f"run is {run.status} ({run.error})"
    frozen.wait_for_log(
        rf"Task threads\.tool \S+\[{re.escape(key)}~[0-9a-f]{{8}}\] succeeded in [^:]*: 'fence lost'",
        timeout=SETTLE_S,
        what="the resumed execution being left",
    )
    effects = effects_of_ref(cluster, ref)
    assert len(effects) == 1, f"the effect must happen once, not again when the frozen worker resumes: {effects}"
    assert effects[0].pid != line.pid, "the effect is the re-run's, on the other worker"
    assert [r.content for r in cluster.tool_results(handle.thread_id)] == ["done:charge_checked:" + ref]
