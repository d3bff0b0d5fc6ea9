"""The agent_tool channel: every transition reaches subscribers and the log; inspection reasons."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete, update

from tests.support.waiting import eventually
from threads_celery import Agent, Detached, Threads
from threads_celery.store.schema import agent_tool_runs, runs
from threads_celery.telemetry.observability import ObservedEvent, subscribe
from threads_celery.testing import ScriptedModel, say
from threads_celery.transitions.runs import utcnow

child = Agent(name="quick", instructions="x", model=ScriptedModel([say("done")], per="run"))
parent = Agent(name="host", instructions="x", model=ScriptedModel([say("hi")], per="run"))


def test_dispatch_delivery_and_cancel_are_published_to_subscribers() -> None:
    seen: list[ObservedEvent] = []
    unsubscribe = subscribe("agent_tool", seen.append)
    try:
        with Threads.embedded(reconcile_interval=None) as threads:
            thread_id = threads.wait(threads.start(parent, "hello").run_id, 20).thread_id
            result = threads.run_agent_tool(thread_id, child, "go", run_id="obs-1")
            assert result.summary == "done"
            eventually(
                lambda: any(e.type == "agent_tool:delivered" for e in seen), timeout=10, what="the delivery event"
            )
            handle = threads.run_agent_tool(thread_id, child, "go", detached=Detached(), run_id="obs-2")
            threads.cancel_agent_tool(handle.run_id)
    finally:
        unsubscribe()
    types = [(e.type, e.payload["run_id"]) for e in seen]
    assert ("agent_tool:dispatched", "obs-1") in types
    assert ("agent_tool:delivered", "obs-1") in types
    assert ("agent_tool:dispatched", "obs-2") in types


def test_a_failing_subscriber_is_ignored_and_unknown_channels_are_refused() -> None:
    def broken(event: ObservedEvent) -> None:
        raise RuntimeError("observer bug")

    unsubscribe = subscribe("agent_tool", broken)
    try:
        with Threads.embedded(reconcile_interval=None) as threads:
            thread_id = threads.wait(threads.start(parent, "hello").run_id, 20).thread_id
            assert threads.run_agent_tool(thread_id, child, "go").summary == "done"
    finally:
        unsubscribe()
    with pytest.raises(ValueError, match="unknown channel"):
        subscribe("nope", print)


def test_a_silent_child_whose_record_is_gone_is_sealed_not_tailable() -> None:
    seen: list[ObservedEvent] = []
    unsubscribe = subscribe("agent_tool", seen.append)
    try:
        with Threads.embedded(reconcile_interval=None) as threads:
            thread_id = threads.wait(threads.start(parent, "hello").run_id, 20).thread_id
            handle = threads.run_agent_tool(thread_id, child, "go", detached=Detached(), run_id="obs-3")
            eventually(
                lambda: threads.inspect_agent_tool_run(handle.run_id).status == "completed",
                timeout=10,
                what="the child run completing",
            )
            past = utcnow() - timedelta(hours=2)
            with threads.store.transaction() as tx:  # a row that says running, whose child is gone
                row = tx.get_agent_tool_run(handle.run_id)
                tx.conn.execute(delete(runs).where(runs.c.id == row.child_run_id))
                tx.conn.execute(
                    update(agent_tool_runs)
                    .where(agent_tool_runs.c.run_id == handle.run_id)
                    .values(status="running", last_signal_at=past, check_at=past, delivered=["completed"])
                )
            threads.reconcile()
            sealed = threads.inspect_agent_tool_run(handle.run_id)
    finally:
        unsubscribe()
    assert (sealed.status, sealed.reason, sealed.child_still_running) == ("interrupted", "not-tailable", False)
    assert any(e.type == "agent_tool:recovery:row" and e.payload["finding"] == "gone" for e in seen)
