"""A reconcile tick's receipt and idle success go to DEBUG; one that did something stays at INFO."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from threads_celery.worker import quiet_ticks

RECEIVED = "Task %(name)s[%(id)s] received"
SUCCEEDED = "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s"


@pytest.fixture
def trace_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("celery.app.trace")
    saved = list(logger.filters)
    quiet_ticks.install()
    quiet_ticks.install()  # idempotent
    assert sum(isinstance(f, quiet_ticks.QuietTicks) for f in logger.filters) == 1
    caplog.set_level(logging.INFO, logger="celery.app.trace")
    try:
        yield caplog
    finally:
        logger.filters[:] = saved


def _log(fmt: str, **data: object) -> None:
    logging.getLogger("celery.app.trace").info(fmt, data, extra={"data": data})


def test_an_idle_tick_is_not_logged_at_info(trace_log: pytest.LogCaptureFixture) -> None:
    _log(RECEIVED, name="threads.reconcile", id="t1")
    _log(
        SUCCEEDED,
        name="threads.reconcile",
        id="t1",
        runtime=0.01,
        return_value="\"{'expired_runs': 0, 'republished': 0}\"",
    )
    _log(SUCCEEDED, name="threads.reconcile", id="t2", runtime=0.01, return_value="'covered by a later tick'")
    assert trace_log.records == []


def test_a_tick_that_did_something_and_all_other_tasks_stay_at_info(trace_log: pytest.LogCaptureFixture) -> None:
    _log(
        SUCCEEDED,
        name="threads.reconcile",
        id="t3",
        runtime=0.01,
        return_value="\"{'expired_runs': 2, 'republished': 0}\"",
    )
    _log(RECEIVED, name="threads.tool send_email", id="k1")
    _log(SUCCEEDED, name="threads.step trip-planner", id="s1", runtime=0.2, return_value="'called 1 tool'")
    assert [(r.levelname, r.getMessage().split("[")[0]) for r in trace_log.records] == [
        ("INFO", "Task threads.reconcile"),
        ("INFO", "Task threads.tool send_email"),
        ("INFO", "Task threads.step trip-planner"),
    ]


def test_with_debug_on_an_idle_tick_shows_at_debug(trace_log: pytest.LogCaptureFixture) -> None:
    trace_log.set_level(logging.DEBUG, logger="celery.app.trace")
    _log(RECEIVED, name="threads.reconcile", id="t4")
    assert [(r.levelname, r.getMessage()) for r in trace_log.records] == [
        ("DEBUG", "Task threads.reconcile[t4] received")
    ]
