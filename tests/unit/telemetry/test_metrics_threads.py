"""Metrics in a worker of many threads: the instruments are created once however many threads
ask at once, and a metric that fails to record never fails the step it measures (the provider
has answered by then: failing the step would ask, and bill, again)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from threads_celery.telemetry import metrics

pytest.importorskip("prometheus_client")

RACE = textwrap.dedent(
    """
    import threading, time
    from threads_celery.telemetry import metrics

    real_init = metrics._Instruments.__init__

    def slow_init(self):
        time.sleep(0.2)  # every thread is inside instruments() before the first one is done
        real_init(self)

    metrics._Instruments.__init__ = slow_init
    start = threading.Barrier(8)
    failures = []

    def first_step():
        start.wait()
        try:
            with metrics.timed_step("racer"):
                pass
            metrics.instruments().step  # the same instruments for every thread
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=first_step) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("FAILURES", failures)
    from prometheus_client import REGISTRY
    print("COUNT", REGISTRY.get_sample_value("threads_step_duration_seconds_count", {"agent": "racer"}))
    """
)


def test_eight_threads_ending_their_first_steps_at_once_create_the_instruments_once() -> None:
    # A fresh interpreter: the instruments are the process's, created at most once.
    done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "FAILURES []" in done.stdout, done.stdout + done.stderr
    assert "COUNT 8.0" in done.stdout, done.stdout


def test_a_metric_that_fails_to_record_does_not_fail_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __getattr__(self, name: str) -> object:
            raise ValueError("the registry is broken")

    monkeypatch.setattr(metrics, "instruments", lambda: Broken())
    ran = []
    with metrics.timed_step("agent"):
        ran.append("step")
    with metrics.timed_tool("tool"):
        ran.append("tool")
    metrics.run_finished("completed")
    assert ran == ["step", "tool"]
