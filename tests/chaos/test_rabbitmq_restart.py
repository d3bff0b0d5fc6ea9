"""Chaos: RabbitMQ as production runs it (quorum queues, publisher confirms) restarted mid-soak.

A backlog of runs of every effect class is started at once on a ``rabbitmq-server`` of the test's
own (tests/support/private_rabbitmq.py: its own node, data and ports; the machine's broker is never
touched), worked by two prefork workers and a real Beat. Once a fifth of the runs settled, the
workers are frozen (SIGSTOP, so nothing consumes while we count), the queue's ready messages are
counted, the broker is stopped (RabbitMQ's orderly shutdown) and started again on the same data,
and the messages are counted again: a quorum queue keeps every one of them (a Redis without
persistence keeps none: tests/chaos/test_infrastructure_restarts.py shows the backbone
republishing them). The workers are resumed; they reconnect, and every run must settle under the
soak's invariants (tests/chaos/soak_checks.py): none lost, no unguarded effect twice, no call with
two results. ``CHAOS_RABBITMQ_RUNS`` sets the backlog (default 80).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import chaos_agents
from tests.chaos.conftest import DEFAULT_CHAOS_ENV, ChaosCluster
from tests.chaos.soak_checks import SETTLED, check_runs, describe_stuck, statuses
from tests.support.private_rabbitmq import PrivateRabbitMQ
from tests.support.waiting import eventually

RUNS = int(os.environ.get("CHAOS_RABBITMQ_RUNS", "80"))
DEADLINE_S = 240.0
KINDS = ["read_only", "idempotent", "reconcilable", "unguarded", "unguarded"]


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[PrivateRabbitMQ]:
    server = PrivateRabbitMQ()
    try:
        yield server.start()
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def rabbit_cluster(
    rabbitmq: PrivateRabbitMQ, chaos_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(
        database_url=chaos_database_url,
        broker_url=rabbitmq.url,
        directory=Path(tmp_path_factory.mktemp("chaos-rabbitmq")),
        settings_env=dict(DEFAULT_CHAOS_ENV),
    )
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_rabbitmq_restart_mid_soak_keeps_every_queued_task(
    rabbitmq: PrivateRabbitMQ, rabbit_cluster: ChaosCluster
) -> None:
    cluster = rabbit_cluster
    rng = random.Random(RUNS)
    workers = [cluster.start_worker(wait=False) for _ in range(2)]
    cluster.start_beat(wait=False)
    started: dict[str, tuple[str, str]] = {}
    for kind in rng.choices(KINDS, k=RUNS):
        ref = uuid.uuid4().hex[:12]
        seconds = round(rng.uniform(0.05, 0.3), 3)
        handle = cluster.threads.start(
            chaos_agents.AGENTS[kind], chaos_agents.message(ref, seconds=seconds, repeat_seconds=seconds)
        )
        started[handle.run_id] = (kind, ref)
    for worker in workers:
        worker.wait_ready()

    pending, final = set(started), {}

    def poll() -> None:
        for run_id, status in statuses(cluster, pending).items():
            if status in SETTLED:
                final[run_id] = status
                pending.discard(run_id)

    def a_fifth_settled() -> bool:
        poll()
        return len(final) >= RUNS // 5

    eventually(a_fifth_settled, timeout=120, what="a fifth of the runs settled")
    for worker in workers:
        worker.stop()  # SIGSTOP: nothing consumes while the queue is counted
    time.sleep(0.5)  # a message on its way to a frozen consumer stays unacked, and counts as ready after the restart
    before = rabbitmq.queue_depth("threads")
    rabbitmq.restart()
    after = rabbitmq.queue_depth("threads")
    for worker in workers:
        worker.cont()
    print(f"\nrabbitmq restart: {before} messages ready before, {after} after ({len(final)}/{RUNS} runs settled)")
    assert before is not None and before > 0, "a backlog must wait in the queue when the broker restarts"
    assert after is not None and after >= before, f"the restart lost queued tasks: {before} before, {after} after"

    began = time.monotonic()
    while pending and time.monotonic() - began < DEADLINE_S:
        poll()
        time.sleep(0.2)
    cluster.threads.store.engine.dispose()
    assert not pending, f"{len(pending)} runs unsettled:\n" + describe_stuck(cluster, pending)
    report = check_runs(cluster, started, final)
    assert not report["problems"], "\n".join(report["problems"][:40])
    assert report["statuses"]["completed"] + report["statuses"]["parked"] == RUNS
    assert report["unguarded_duplicates"] == 0
