"""Prometheus metrics: what the ledger holds, read at each scrape, and latencies the workers observe.

From the ledger (:class:`LedgerCollector`, served by the API at ``GET /v1/metrics`` with its
bearer token, and by a worker started with ``THREADS_METRICS_PORT``):

- ``threads_runs{status}``: runs by status;
- ``threads_parked_calls``, ``threads_awaiting_runs{status}``: what waits for a person;
- ``threads_outbox_depth``: task messages committed and not yet consumed;
- ``threads_reconcile_lag_seconds``: how long the most overdue outbox row has waited past the
  time the reconcile backbone should have republished it (0 when none is overdue).

Observed where the work runs (each worker process; with ``PROMETHEUS_MULTIPROC_DIR`` set, a
prefork worker's children are summed, as ``prometheus_client`` does):

- ``threads_step_duration_seconds{agent}``: model steps; ``threads_tool_duration_seconds{tool}``:
  tool calls; ``threads_reconcile_tick_seconds``: reconcile ticks; ``threads_runs_finished_total
  {status}``: runs ended by this process.

``prometheus-client`` is the ``metrics`` extra; without it the observations are no-ops.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry  # optional: threads-celery[metrics]
    from prometheus_client.metrics_core import Metric

    from threads_celery.store import Store

METRICS_PORT_VARIABLE = "THREADS_METRICS_PORT"


class _Instruments:
    """The process's histograms and counters, created once (prometheus_client refuses twice)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram  # optional: threads-celery[metrics]

        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.step = Histogram("threads_step_duration_seconds", "Model step latency.", ["agent"], buckets=buckets)
        self.tool = Histogram("threads_tool_duration_seconds", "Tool call latency.", ["tool"], buckets=buckets)
        self.tick = Histogram("threads_reconcile_tick_seconds", "Reconcile tick duration.", buckets=buckets)
        self.finished = Counter("threads_runs_finished", "Runs ended by this process.", ["status"])


_instruments: _Instruments | None = None
_unavailable = False
_instruments_lock = threading.Lock()
_log = logging.getLogger(__name__)


def instruments() -> _Instruments | None:
    """The instruments, or None without prometheus-client.

    Created once per process under a lock: two threads of a ``-P threads`` worker (or of
    ``Threads.embedded()``) ending their first steps at once would otherwise both create them, and
    prometheus_client refuses the second with ``Duplicated timeseries``.
    """
    global _instruments, _unavailable
    if _instruments is not None or _unavailable:
        return _instruments
    with _instruments_lock:
        if _instruments is None and not _unavailable:
            try:
                _instruments = _Instruments()
            except ImportError:
                _unavailable = True
    return _instruments


def _observe(record: Callable[[_Instruments], None]) -> None:
    """Record one observation; a metric that cannot be recorded is logged, never raised.

    An observation is made after the work it measures, often after a provider has answered and
    billed a request: failing the step there would have the model asked again.
    """
    try:
        found = instruments()
        if found is not None:
            record(found)
    except Exception:  # noqa: BLE001 - a metric is never worth a step
        _log.warning("a metric could not be recorded", exc_info=True)


@contextmanager
def timed_step(agent: str) -> Iterator[None]:
    """Observe a model step's duration."""
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        _observe(lambda found: found.step.labels(agent=agent).observe(elapsed))


@contextmanager
def timed_tool(tool: str) -> Iterator[None]:
    """Observe a tool call's duration."""
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        _observe(lambda found: found.tool.labels(tool=tool).observe(elapsed))


@contextmanager
def timed_tick() -> Iterator[None]:
    """Observe a reconcile tick's duration."""
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        _observe(lambda found: found.tick.observe(elapsed))


def run_finished(status: str) -> None:
    """Count a run this process ended."""
    _observe(lambda found: found.finished.labels(status=status).inc())


class LedgerCollector:
    """A prometheus_client collector that reads the ledger at each scrape (a few counting queries)."""

    def __init__(
        self, store: Store, *, clock: Callable[[], datetime] | None = None, deploy_liveness_s: float = 30.0
    ) -> None:
        self.store = store
        self.clock = clock or (lambda: datetime.now(UTC))
        self.deploy_liveness_s = deploy_liveness_s

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # optional: threads-celery[metrics]

        with self.store.read() as tx:
            snapshot = tx.metrics_snapshot(self.clock())
        runs = GaugeMetricFamily("threads_runs", "Runs in the ledger by status.", labels=["status"])
        for status, count in sorted(snapshot.runs_by_status.items()):
            runs.add_metric([status], count)
        yield runs
        yield GaugeMetricFamily("threads_parked_calls", "Tool calls parked for a person.", value=snapshot.parked_calls)
        awaiting = GaugeMetricFamily("threads_awaiting_runs", "Runs waiting for a person.", labels=["status"])
        for status in ("awaiting_approval", "awaiting_variable", "parked"):
            awaiting.add_metric([status], snapshot.runs_by_status.get(status, 0))
        yield awaiting
        yield GaugeMetricFamily(
            "threads_outbox_depth",
            "Task messages committed, not yet consumed.",
            value=snapshot.outbox_depth,
        )
        yield GaugeMetricFamily(
            "threads_reconcile_lag_seconds",
            "How long the most overdue outbox row waited past its republish time.",
            value=snapshot.reconcile_lag_s,
        )
        yield from self._deploy_metrics(GaugeMetricFamily)

    def _deploy_metrics(self, gauge: Any) -> Iterator[Metric]:
        """Per deployment version: live workers, unfinished runs, and runs stranded with no live
        worker (an alert on ``threads_deploy_stranded_runs > 0`` catches a drain gone wrong)."""
        from threads_celery.decisions.deploys import version_statuses

        with self.store.read() as tx:
            versions = tx.deploy_versions()
            if not versions:
                return
            workers, unfinished = tx.deploy_workers_seen(), tx.unfinished_by_version()
        statuses = version_statuses(
            versions, workers, unfinished, now=self.clock(), liveness=timedelta(seconds=self.deploy_liveness_s)
        )
        for name, doc, value_of in (
            ("threads_deploy_workers", "Live workers per deployment version.", lambda s: len(s.workers)),
            ("threads_deploy_unfinished_runs", "Unfinished runs per deployment version.", lambda s: s.unfinished),
            ("threads_deploy_stranded_runs", "Unfinished runs on a version with no live worker.", lambda s: s.stranded),
        ):
            family = gauge(name, doc, labels=["version", "state"])
            for status in statuses:
                family.add_metric([status.version, status.state], value_of(status))
            yield family


def registry_for(store: Store) -> CollectorRegistry:
    """A registry with the ledger's gauges and this process's instruments (or every prefork
    child's, with PROMETHEUS_MULTIPROC_DIR)."""
    from prometheus_client import CollectorRegistry  # optional: threads-celery[metrics]

    registry = CollectorRegistry()
    registry.register(LedgerCollector(store))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess  # optional: threads-celery[metrics]

        # prometheus_client leaves this constructor unannotated (the rest of its API is typed).
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        found = instruments()
        if found is not None:
            for collector in (found.step, found.tool, found.tick, found.finished):
                registry.register(collector)
    return registry


def render(store: Store) -> tuple[bytes, str]:
    """The metrics in Prometheus' text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # optional: threads-celery[metrics]

    return generate_latest(registry_for(store)), CONTENT_TYPE_LATEST


def serve(store: Store, port: int) -> None:
    """Serve ``/metrics`` on ``port`` from a background thread (a worker's THREADS_METRICS_PORT)."""
    from prometheus_client import start_http_server  # optional: threads-celery[metrics]

    start_http_server(port, registry=registry_for(store))


__all__ = [
    "METRICS_PORT_VARIABLE",
    "LedgerCollector",
    "instruments",
    "registry_for",
    "render",
    "run_finished",
    "serve",
    "timed_step",
    "timed_tick",
    "timed_tool",
]
