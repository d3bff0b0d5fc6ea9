"""threads_celery.testing.start_worker: an in-process worker for users' own integration tests,
against PostgreSQL and a real broker, Redis and RabbitMQ (not only the embedded SQLite mode).

On RabbitMQ each test has a vhost of its own on the machine's server (tests/support/rabbitmq.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.rabbitmq import rabbitmq_vhost
from threads_celery import Agent, Threads, tool
from threads_celery.testing import ScriptedModel, call, say, start_worker

RUN_TIMEOUT_S = 60.0


class DoubleIn(BaseModel):
    n: int


ran_on: list[str] = []


def _double(inp: DoubleIn, ctx: Any) -> dict[str, int]:
    ran_on.append(threading.current_thread().name)
    return {"double": inp.n * 2}


double = tool(
    name="double", description="Double a number.", input=DoubleIn, effect="read_only", execute=_double,
    queue="slow-tools",
)  # fmt: skip
doubler = Agent(
    name="in-process-doubler",
    instructions="Double numbers.",
    model=ScriptedModel([call("double", n=21), say("It is 42.")]),
    tools=[double],
)
stepper = Agent(
    name="in-process-stepper",
    instructions="Answer.",
    model=ScriptedModel([say("hello")]),
    queue="agent-steps",
)


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        yield request.getfixturevalue("redis_url")
        return
    with rabbitmq_vhost() as url:
        yield url


@pytest.fixture
def threads(migrated_pg_url: str, broker_url: str) -> Iterator[Threads]:
    client = Threads(database_url=migrated_pg_url, broker_url=broker_url)
    try:
        client.register(doubler)
        client.register(stepper)
        yield client
    finally:
        client.close()


def test_a_run_completes_on_postgresql_and_a_broker_with_an_in_process_worker(
    threads: Threads,
) -> None:
    assert not threads.is_embedded
    ran_on.clear()
    with start_worker(threads, reconcile_interval=None):
        run = threads.wait(threads.start("in-process-doubler", "double 21").run_id, timeout=RUN_TIMEOUT_S)
    assert run.status == "completed", run
    results = [m.tool_result for m in threads.messages(run.thread_id) if m.tool_result is not None]
    assert len(results) == 1 and not results[0].is_error and "42" in results[0].content
    # The tool's own queue (slow-tools) was consumed, by a thread of this process.
    assert len(ran_on) == 1


def test_an_agents_own_queue_is_consumed(threads: Threads) -> None:
    # The stepper's model steps go to "agent-steps": only a worker consuming it completes the run.
    with start_worker(threads):
        run = threads.wait(threads.start("in-process-stepper", "hi").run_id, timeout=RUN_TIMEOUT_S)
    assert run.status == "completed", run


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("threads-embedded")]


def test_each_stop_leaves_no_worker_thread_behind(threads: Threads) -> None:
    """Stopped from the worker's own thread: on RabbitMQ a stop that closed the consumer's
    channels from another thread hung past its join (30 s each), once for good, and left the
    worker's thread running behind the next test's worker."""
    before = worker_threads()
    for attempt in range(5):
        with start_worker(threads):
            run = threads.wait(threads.start("in-process-stepper", f"hi {attempt}").run_id, timeout=RUN_TIMEOUT_S)
            assert run.status == "completed", run
        assert worker_threads() == before, f"after stop {attempt + 1}: {worker_threads()}"
