"""The reconcile backbone on the embedded store: expired leases and lost publishes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, update

from tests.support.waiting import eventually
from threads_celery import Agent, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.store.schema import outbox, runs, tool_calls
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow

RELEASE = threading.Event()
CALLS: list[int] = []


class In(BaseModel):
    n: int


def _charge(inp: In, ctx) -> str:
    CALLS.append(ctx.attempt)
    if ctx.attempt == 1:
        RELEASE.wait(10)
    return f"charged {inp.n} (attempt {ctx.attempt})"


charge = tool(
    name="charge", description="Charge.", input=In, effect="idempotent", dedup_window_ms=3_600_000, execute=_charge
)
agent = Agent(
    name="charger",
    instructions="Charge.",
    model=ScriptedModel([call("charge", n=5), say("done")]),
    tools=[charge],
    permissions=Permissions.allow_all(),
)


@pytest.fixture
def threads(embedded_threads: Callable[..., Threads]) -> Iterator[Threads]:
    CALLS.clear()
    RELEASE.clear()
    yield embedded_threads(reconcile_interval=None)  # ticks by hand only, to count them
    RELEASE.set()  # a first attempt still blocked wakes up before the runtime closes


def test_a_run_whose_lease_expired_is_fenced_off_and_its_call_settled_by_effect(threads: Threads) -> None:
    handle = threads.start(agent, "charge 5")
    eventually(lambda: CALLS == [1], timeout=10, what="the first attempt running and blocked")
    # The worker "dies": its lease lapses (we move the clock of the ledger instead of waiting).
    past = utcnow() - timedelta(seconds=1)
    with threads.store.transaction() as tx:
        tx.conn.execute(update(runs).where(runs.c.id == handle.run_id).values(lease_expires_at=past))
        tx.conn.execute(update(tool_calls).where(tool_calls.c.run_id == handle.run_id).values(lease_expires_at=past))
    runtime = threads.app.threads_runtime.get()
    published: list[Any] = []
    publish = runtime.publish
    runtime.publish = lambda entries: (published.extend(entries), publish(entries))[-1]
    assert threads.reconcile() == {"expired_runs": 1, "republished": 0}
    # Re-dispatched from a dead worker: published ahead of waiting work (Redis priority). The
    # in-process worker may already have run it and published the next step by now: only the
    # tick's own publish is marked recovered, and it came first.
    assert (published[0].key, published[0].recovered) == (f"{handle.run_id}:0:0", True)
    assert [e.key for e in published if e.recovered] == [f"{handle.run_id}:0:0"]
    run = threads.wait(handle.run_id, 20)
    assert run.status == "completed"
    assert CALLS == [1, 2]  # idempotent, inside its window: sent again with the same key
    RELEASE.set()  # the "dead" first attempt wakes up; its late write must be refused
    eventually(
        lambda: threads.app.threads_runtime.get().keeper._held == {},
        timeout=10,
        what="the lease keeper holding no lease",
    )
    results = [m for m in threads.messages(run.thread_id) if m.role == "tool"]
    assert [m.text for m in results] == ["charged 5 (attempt 2)"]
    with threads.store.read() as tx:
        assert tx.conn.execute(select(tool_calls.c.attempt)).scalar() == 2


def test_a_lost_publish_is_republished_when_due(threads: Threads) -> None:
    RELEASE.set()
    threads.publisher.send = lambda entry: None  # type: ignore[method-assign] - the doorbell never rings
    handle = threads.start(agent, "charge 5")
    with threads.store.read() as tx:
        assert tx.outbox_keys() == [f"step:{handle.run_id}:0"]
    assert threads.get_run(handle.run_id).status == "queued"
    with threads.store.transaction() as tx:
        tx.conn.execute(update(outbox).values(due_at=utcnow() - timedelta(seconds=1)))
    del threads.publisher.send  # the broker is back (the reconciler publishes with its own)
    assert threads.reconcile()["republished"] == 1
    assert threads.wait(handle.run_id, 20).status == "completed"
    with threads.store.read() as tx:
        assert tx.outbox_keys() == []


def test_nothing_due_means_a_tick_does_nothing(threads: Threads) -> None:
    RELEASE.set()
    handle = threads.start(agent, "charge 5")
    assert threads.wait(handle.run_id, 20).status == "completed"
    assert threads.reconcile() == {"expired_runs": 0, "republished": 0}


def test_the_embedded_runtime_ticks_the_backbone_by_itself() -> None:
    RELEASE.set()
    with Threads.embedded(reconcile_interval=0.05) as threads:
        threads.publisher.send = lambda entry: None  # type: ignore[method-assign] - a lost publish
        handle = threads.start(agent, "charge 5")
        with threads.store.transaction() as tx:
            tx.conn.execute(update(outbox).values(due_at=utcnow() - timedelta(seconds=1)))
        assert threads.wait(handle.run_id, 20).status == "completed"  # nobody called reconcile()
