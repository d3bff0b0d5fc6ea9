"""A PostgreSQL restart yields at most a 503 and a retry, never a wrong "not found".

The test starts a PostgreSQL server of its own on a free port (initdb/pg_ctl), never the
machine's, and stops and starts it under a runtime, the HTTP API and the web app example.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from fastapi.testclient import TestClient

from examples.webapp.app import create_app as create_webapp
from tests.support.own_postgres import OwnPostgres, own_postgres
from threads_celery import Agent, Settings, Threads
from threads_celery.api.app import create_api
from threads_celery.exceptions import RunNotFound, StoreUnavailable
from threads_celery.testing import ScriptedModel, say

TOKEN = "restart-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T = TypeVar("T")

greeter = Agent(name="restart_greeter", instructions="Greet.", model=ScriptedModel([say("Hello.")]))


@pytest.fixture(scope="module")
def server() -> Iterator[OwnPostgres]:
    with own_postgres() as pg:
        yield pg


@pytest.fixture(scope="module")
def threads(server: OwnPostgres) -> Iterator[Threads]:
    url = server.create_database("ledger")
    runtime = Threads(database_url=url, broker_url="memory://", settings=Settings(), migrate=True, worker_concurrency=1)
    runtime.register(greeter)
    runtime.start_worker(reconcile_interval=None)
    try:
        yield runtime
    finally:
        runtime.stop_worker()
        runtime.close()


def at_most_one_failure(probe: Callable[[], T], is_failure: Callable[[T], bool]) -> tuple[T, int]:
    """``probe()`` until it succeeds; the number of failed tries before (one is allowed)."""
    failures = 0
    for _ in range(3):
        try:
            answer = probe()
        except StoreUnavailable:
            failures += 1
            continue
        if not is_failure(answer):
            return answer, failures
        failures += 1
    raise AssertionError(f"still failing after {failures} tries")


def test_a_stopped_store_is_503_and_unavailable_never_not_found(server: OwnPostgres, threads: Threads) -> None:
    run = threads.wait(threads.start(greeter, "hi").run_id, 30)
    assert run.status == "completed"
    api = TestClient(create_api(threads, tokens={TOKEN}))
    web = TestClient(create_webapp(threads, agent_names=[greeter.name]))
    assert api.get(f"/v1/runs/{run.id}", headers=AUTH).status_code == 200
    assert web.get(f"/runs/{run.id}").status_code == 200
    server.stop()
    try:
        with pytest.raises(StoreUnavailable):
            threads.get_run(run.id)
        with pytest.raises(StoreUnavailable):
            threads.messages(run.thread_id)
        for path in (f"/v1/runs/{run.id}", f"/v1/threads/{run.thread_id}/messages", "/v1/parked"):
            response = api.get(path, headers=AUTH)
            assert response.status_code == 503, (path, response.status_code, response.text)
            assert response.json()["error"]["type"] == "store_unavailable"
        page = web.get(f"/runs/{run.id}")
        assert page.status_code == 503 and "No run" not in page.text
        assert web.get(f"/runs/{run.id}/events").status_code == 503
    finally:
        server.start()
    # Back: each caller sees the run again, after at most one failed try on a stale connection.
    found, failures = at_most_one_failure(lambda: threads.get_run(run.id), lambda r: r is None)
    assert found.id == run.id and failures <= 1
    response, failures = at_most_one_failure(
        lambda: api.get(f"/v1/runs/{run.id}", headers=AUTH), lambda r: r.status_code == 503
    )
    assert response.status_code == 200 and failures <= 1
    page, failures = at_most_one_failure(lambda: web.get(f"/runs/{run.id}"), lambda r: r.status_code == 503)
    assert page.status_code == 200 and failures <= 1
    with pytest.raises(RunNotFound):  # a run that does not exist is still "not found"
        threads.get_run("run_that_does_not_exist")


def test_a_restart_between_two_requests_is_a_503_at_most_once(server: OwnPostgres, threads: Threads) -> None:
    run = threads.wait(threads.start(greeter, "again").run_id, 30)
    api = TestClient(create_api(threads, tokens={TOKEN}))
    assert api.get(f"/v1/runs/{run.id}", headers=AUTH).status_code == 200  # pooled connections exist
    server.stop()
    server.start()
    statuses = [api.get(f"/v1/runs/{run.id}", headers=AUTH).status_code for _ in range(3)]
    assert 404 not in statuses and 500 not in statuses, statuses
    assert statuses[-1] == 200 and statuses.count(503) <= 1, statuses
    # The worker's own pooled connections went stale too: its tasks retry, and the run completes.
    after = threads.start(greeter, "after").run_id
    assert threads.wait(after, 60).status == "completed"


def test_statements_on_kept_connections_go_out_on_fresh_ones_after_a_restart(
    server: OwnPostgres, threads: Threads
) -> None:
    """The hot path's own statements run on connections kept open (store/direct.py). One whose
    server ended it while idle is left behind, not used: the first start and the first read
    after a restart succeed, as through the engine, which pings a connection before its use."""
    first = threads.start(greeter, "before the restart")
    assert threads.wait(first.run_id, timeout=30).status == "completed"
    assert threads.store.run(first.run_id) is not None  # a kept connection, now idle
    server.stop()
    server.start()
    handle = threads.start(greeter, "after the restart")  # a new thread: START_RUN_PG, direct
    assert threads.store.run(handle.run_id) is not None
    assert threads.wait(handle.run_id, timeout=30).status == "completed"
