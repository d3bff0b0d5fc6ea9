"""``Publisher.ensure_reachable``: what ``start()`` asks of the broker before it records a run.

A publish or check that reached the broker vouches for it for a second: no connection of its
own is opened then. A failed publish, or a second gone by, makes the next ask open one again.
"""

from __future__ import annotations

from typing import Any, Self

import pytest

from tests.support.publishes import record_publishes
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import BrokerUnavailable
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.transitions import publishing
from threads_celery.transitions.publishing import Publisher
from threads_celery.transitions.runs import STEP_TASK
from threads_celery.worker.application import create_app

ENTRY = OutboxEntry(key="step:r:0", task=STEP_TASK, args=("r", 0))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> tuple[Publisher, list[str], Clock, dict[str, Any]]:
    app = create_app(Settings(), AgentRegistry(), broker_url="memory://")
    publisher = Publisher(app)
    checks: list[str] = []
    state: dict[str, Any] = {"broker_up": True, "publish_fails": False}

    class Connection:
        """What ``check`` opens: counted, and refused while the broker is down."""

        def __enter__(self) -> Self:
            checks.append("check")
            return self

        def __exit__(self, *exc_info: object) -> None:
            return None

        def ensure_connection(self, **_: Any) -> None:
            if not state["broker_up"]:
                raise OSError("connection refused")

    clock = Clock()
    monkeypatch.setattr(publishing.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(app, "connection_for_write", Connection)
    record_publishes(monkeypatch, app, fail=lambda: state["publish_fails"])
    return publisher, checks, clock, state


def test_a_publish_that_went_through_vouches_for_the_broker_for_a_second(setup: Any) -> None:
    publisher, checks, clock, _ = setup
    publisher.ensure_reachable()
    assert checks == ["check"]  # nothing vouched yet: asked
    publisher([ENTRY])
    clock.now += publishing.REACHABLE_FOR_S / 2
    publisher.ensure_reachable()
    assert checks == ["check"]
    clock.now += publishing.REACHABLE_FOR_S
    publisher.ensure_reachable()
    assert checks == ["check", "check"]  # the second is gone: asked again


def test_a_failed_publish_makes_the_next_start_ask_the_broker(setup: Any) -> None:
    publisher, checks, _, state = setup
    publisher([ENTRY])
    state["publish_fails"] = True
    publisher([ENTRY])  # logged and left in the outbox
    state["broker_up"] = False
    with pytest.raises(BrokerUnavailable):
        publisher.ensure_reachable()
    assert checks == ["check"]


def test_a_failed_check_answers_for_the_broker_for_a_second(setup: Any) -> None:
    # During an outage each start would otherwise wait for a connection of its own to time out.
    publisher, checks, clock, state = setup
    state["broker_up"] = False
    with pytest.raises(BrokerUnavailable, match="cannot reach the broker"):
        publisher.ensure_reachable()
    assert checks == ["check"]
    clock.now += publishing.UNREACHABLE_FOR_S / 2
    with pytest.raises(BrokerUnavailable, match="connection refused"):
        publisher.ensure_reachable()  # refused at once, with what the check said
    assert checks == ["check"]
    state["broker_up"] = True
    clock.now += publishing.UNREACHABLE_FOR_S
    publisher.ensure_reachable()  # the second is gone: asked again, and the broker is back
    assert checks == ["check", "check"]
    publisher.ensure_reachable()
    assert checks == ["check", "check"]  # and now vouched for
