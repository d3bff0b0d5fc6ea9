"""The deploy gauges: live workers, unfinished and stranded runs per version, on a scrape."""

from __future__ import annotations

import pytest

from tests.unit.telemetry.test_metrics import samples
from threads_celery import Threads
from threads_celery.records import DEFAULT_TENANT
from threads_celery.transitions.runs import submit_run, utcnow

pytest.importorskip("prometheus_client", reason="prometheus-client is in the test extra")


def test_a_version_without_a_live_worker_counts_its_runs_stranded() -> None:
    from threads_celery.telemetry.metrics import render

    with Threads.embedded(reconcile_interval=None) as threads:
        assert "threads_deploy_" not in render(threads.store)[0].decode()  # no versions: no gauges
        with threads.store.transaction() as tx:
            tx.register_version("v1", {}, utcnow())
            tx.register_version("v2", {}, utcnow())
            tx.worker_seen("host:2", "v2", utcnow())
            tx.set_current_version("v2", utcnow())
            for _ in range(2):  # recorded, never published: only their rows matter here
                run, _ = submit_run(tx, agent="a", config_hash="h", message="m", now=utcnow(), tenant=DEFAULT_TENANT)
                tx.place_run(run.id, "v1", "pinned")
        found = samples(render(threads.store)[0].decode())
    assert found[("threads_deploy_stranded_runs", (("state", "draining"), ("version", "v1")))] == 2
    assert found[("threads_deploy_unfinished_runs", (("state", "draining"), ("version", "v1")))] == 2
    assert found[("threads_deploy_workers", (("state", "active"), ("version", "v2")))] == 1
    assert found[("threads_deploy_stranded_runs", (("state", "active"), ("version", "v2")))] == 0
