"""The fleet under partitions and bad links: a backlog soak per fault, one table per fault.

CI runs the lean slice: two faults, each on ``THREADS_FLEET_RUNS`` runs (default 100) over three
workers of two processes: a worker cut from PostgreSQL while its workers hold runs (on Redis), and a
worker cut from the broker (on RabbitMQ). ``THREADS_FLEET=full`` runs every fault of
:data:`tests.fleet.faults.FAULTS` on both brokers, each on a fleet of its own with at least 200 runs
(300 by default) and 16 worker processes (6, 5 and 5 on w1, w2 and w3). See tests/fleet/README.md.
"""

from __future__ import annotations

import os

import pytest

from tests.fleet.cluster import BROKERS, WORKER_HOSTS, Fleet
from tests.fleet.faults import FAULTS, report_table, run_scenario

FULL = os.environ.get("THREADS_FLEET", "") == "full"
RUNS = int(os.environ.get("THREADS_FLEET_RUNS", "300" if FULL else "100"))
SEED = int(os.environ.get("THREADS_FLEET_SEED", "26"))
CONCURRENCY = (6, 5, 5) if FULL else (2, 2, 2)
# Longer tools in the full run: 16 processes would otherwise clear the backlog before the heal.
TOOL_SECONDS = (1.0, 2.5) if FULL else (0.4, 1.2)


def _soak(fleet: Fleet, fault_name: str) -> None:
    workers = [
        fleet.start_worker(wait=False, concurrency=n, FLEET_HOST=host)
        for host, n in zip(WORKER_HOSTS, CONCURRENCY, strict=True)
    ]
    fleet.start_beat(wait=False)
    if FAULTS[fault_name].through_api:
        fleet.start_api()
    for worker in workers:
        worker.wait_ready(timeout=120)
    outcome = run_scenario(fleet, FAULTS[fault_name], workers, RUNS, SEED, TOOL_SECONDS)
    print(report_table(outcome))
    assert not outcome.problems, "\n".join(outcome.problems[:40])


LEAN = {"redis": "worker cut from PostgreSQL", "rabbitmq": "worker cut from the broker"}


def test_a_worker_cut_from_postgresql_while_it_holds_runs(fleet: Fleet) -> None:
    _soak(fleet, LEAN["redis"])


@pytest.mark.parametrize("fleet", ["rabbitmq"], indirect=True)
def test_a_worker_cut_from_rabbitmq_while_it_holds_runs(fleet: Fleet) -> None:
    _soak(fleet, LEAN["rabbitmq"])


@pytest.mark.skipif(not FULL, reason="every fault runs with THREADS_FLEET=full (tests/fleet/README.md)")
@pytest.mark.parametrize(
    ("fleet", "fault_name"),
    [(broker, name) for broker in BROKERS for name in FAULTS if name != LEAN[broker]],
    indirect=["fleet"],
)
def test_every_fault(fleet: Fleet, fault_name: str) -> None:
    _soak(fleet, fault_name)
