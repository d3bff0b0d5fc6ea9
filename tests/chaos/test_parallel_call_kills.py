"""Chaos: a worker is SIGKILLed in the middle of a group of concurrent read_only calls.

One model reply makes four concurrent calls; two return at once, two sleep. Once the quick
ones are recorded and the slow ones are under way, every worker running a slow call is
SIGKILLed as a whole (its unacked messages stay with Redis for the visibility timeout, an hour),
and a fresh worker joins. Only the real Beat process (``celery -A tasks beat``, reconcile every
0.5 s) can move the run on: the unrecorded calls' outbox rows fall due and are published again.
The side-effect ledger shows what really ran: the slow (unrecorded) reads twice, the recorded
ones once, and the results reach the conversation in call order.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from tests.chaos import chaos_agents
from tests.support.waiting import eventually
from threads_celery.transitions.runs import effect_key_for

if TYPE_CHECKING:
    from tests.chaos.conftest import ChaosCluster, WorkerProcess

LONG = 30.0
SETTLE_S = 40.0


@pytest.fixture(scope="module")
def workers(cluster: ChaosCluster) -> list[WorkerProcess]:
    return cluster.start_workers(2)


def test_a_worker_killed_mid_group_reruns_only_the_unrecorded_reads_through_beat(
    cluster: ChaosCluster, workers: list[WorkerProcess]
) -> None:
    cluster.start_beat()
    ref = uuid.uuid4().hex[:12]
    handle = cluster.threads.start(chaos_agents.parallel_agent, chaos_agents.message(ref, seconds=LONG))
    keys = [effect_key_for(handle.run_id, 0, i) for i in range(chaos_agents.PARALLEL_CALLS)]
    slow = [keys[i] for i in chaos_agents.PARALLEL_SLOW]
    quick = [k for k in keys if k not in slow]

    slow_lines = [cluster.ledger.wait_for_line("effect", key, timeout=SETTLE_S) for key in slow]
    for key in quick:
        cluster.ledger.wait_for_line("effect", key, timeout=SETTLE_S)
    # The quick calls' results are recorded (the second not shown yet: a slow call comes first).
    eventually(
        lambda: all(cluster.call(k).status in ("finished", "completed") for k in quick),
        timeout=SETTLE_S,
        what="quick calls recorded",
        interval=0.05,
    )
    assert cluster.call(quick[1]).status == "finished"

    victims = {
        cluster.worker_running(line.pid, workers).name: cluster.worker_running(line.pid, workers) for line in slow_lines
    }
    for victim in victims.values():
        victim.kill()
    cluster.start_worker()

    run = cluster.wait_settled(handle.run_id, SETTLE_S)

    assert run.status == "completed", run.error
    counts = cluster.ledger.effect_counts(keys)
    assert {k: counts[k] for k in keys} == {k: (2 if k in slow else 1) for k in keys}
    killed = {line.pid for line in slow_lines}
    assert all(e.pid not in killed for k in slow for e in cluster.ledger.effects(k)[1:]), "reruns ran elsewhere"
    results = cluster.tool_results(handle.thread_id)
    assert [r.content for r in results] == [f"done:fetch_quote_concurrently:{ref}"] * len(keys)
    assert [r.call_id for r in results] == [c.call_id for c in (cluster.call(k) for k in keys)]
    assert run.output == "done"
