"""One lock order on PostgreSQL: a child's step commit and the reconcile tick never deadlock.

Three levels of awaited agent-tool runs: top -> middle -> leaf. The middle run commits a step
(its run, its thread, then its agent-tool row through ``child_signal``) while the reconcile tick
gives up on the silent leaf (which writes the middle run's thread) and looks at the silent
middle row. When the tick locked every due row first, the two waited on each other and
PostgreSQL killed one ("deadlock detected"). The test holds the step commit open at its most
exposed point, lets the tick run into it, and only then lets the commit go on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from tests.support.waiting import eventually
from threads_celery import Agent, Settings
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry
from threads_celery.runtime.machine import Runtime
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.testing import ScriptedModel, say
from threads_celery.transitions import agent_tool_dispatch, agent_tools
from threads_celery.transitions import runs as run_ledger

WAIT_S = 30.0

top = Agent(name="lock_top", instructions="x", model=ScriptedModel([say("top")]))
middle = Agent(name="lock_middle", instructions="x", model=ScriptedModel([say("middle")]))
leaf = Agent(name="lock_leaf", instructions="x", model=ScriptedModel([say("leaf")]))


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    ledger = Store(create_store_engine(parse_database_url(pg_url)))
    upgrade(ledger.engine)
    yield ledger
    ledger.dispose()


def _three_levels(store: Store) -> dict[str, Any]:
    """top run -> middle agent-tool run -> leaf agent-tool run, both rows silent and due."""
    now = run_ledger.utcnow()
    with store.transaction() as tx:
        for agent in (top, middle, leaf):
            tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), now)
        top_run, _ = run_ledger.submit_run(tx, agent=top.name, config_hash=top.config_hash(), message="go", now=now)
        middle_row, _, _ = agent_tool_dispatch.dispatch(
            tx, run_id="agent-tool:middle", parent_thread_id=top_run.thread_id, child=middle, input_value="m",
            now=now, parent_run_id=top_run.id,
        )  # fmt: skip
        assert middle_row.child_run_id is not None and middle_row.child_thread_id is not None
        leaf_row, _, _ = agent_tool_dispatch.dispatch(
            tx, run_id="agent-tool:leaf", parent_thread_id=middle_row.child_thread_id, child=leaf, input_value="l",
            now=now, parent_run_id=middle_row.child_run_id,
        )  # fmt: skip
        long_ago = now - timedelta(hours=1)
        for row_id in (middle_row.run_id, leaf_row.run_id):
            tx.update_agent_tool_run(row_id, last_signal_at=long_ago, no_progress_budget_ms=1000, check_at=long_ago)
        middle_run = tx.get_run(middle_row.child_run_id)
    assert middle_run is not None
    return {"middle_row": middle_row, "leaf_row": leaf_row, "middle_run": middle_run}


def _waiting_on_a_lock(store: Store, pid: int) -> bool:
    with store.read() as tx:
        row = tx.conn.execute(
            text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).first()
    return row is not None and row.wait_event_type == "Lock"


def test_a_child_step_commit_and_the_reconcile_tick_do_not_deadlock(store: Store) -> None:
    rows = _three_levels(store)
    middle_run = rows["middle_run"]
    registry = AgentRegistry()
    for agent in (top, middle, leaf):
        registry.add(agent)
    published: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=published.extend, settings=Settings())
    tick_pids: list[int] = []
    tick_errors: list[BaseException] = []
    tick_result: list[dict[str, int]] = []

    def tick() -> None:
        from threads_celery.runtime.delivery import reconcile_agent_tools

        try:
            tick_result.append(reconcile_agent_tools(runtime))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            tick_errors.append(exc)

    original_begin = store.transaction

    def remember_pid() -> Any:
        # Every transaction the tick opens records its backend's pid, so the test can see it wait.
        context = original_begin()
        tx = context.__enter__()
        tick_pids.append(int(tx.conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
        return _Entered(context, tx)

    ticker = threading.Thread(target=tick, name="reconcile-tick")
    now = run_ledger.utcnow()
    with store.transaction() as commit:
        # The middle run's step commit, as _commit_step makes it: the run, its thread ...
        moved = commit.advance_run(middle_run.id, fence=middle_run.fence, now=now, step=1)
        assert moved is not None
        commit.insert_message(
            thread_id=middle_run.thread_id, run_id=middle_run.id, role="assistant", text="thinking", now=now
        )
        # ... and, before its agent-tool row, the tick runs into it.
        store.transaction = remember_pid  # type: ignore[method-assign]
        try:
            ticker.start()

            def tick_waits_on_the_commit() -> bool:
                if tick_pids and _waiting_on_a_lock(store, tick_pids[-1]):
                    return True
                assert ticker.is_alive(), f"the tick ended without waiting on the commit: {tick_errors or tick_result}"
                return False

            eventually(
                tick_waits_on_the_commit, timeout=WAIT_S, interval=0.02, what="the tick reaching the commit's locks"
            )
        finally:
            store.transaction = original_begin  # type: ignore[method-assign]
        agent_tools.child_signal(
            commit, rows["middle_row"].run_id, now, chunk={"role": "assistant", "text": "thinking"}
        )
    ticker.join(WAIT_S)
    assert not ticker.is_alive()
    assert tick_errors == []
    # Both happened: the commit, and the tick's verdict on the silent rows.
    [result] = tick_result
    assert result["no_progress"] >= 1
    with store.read() as tx:
        leaf_row = tx.get_agent_tool_run(rows["leaf_row"].run_id)
        middle_events = [e.type for e in tx.list_events(middle_run.thread_id)]
        run_after = tx.get_run(middle_run.id)
    assert leaf_row is not None and leaf_row.status == "interrupted" and leaf_row.reason == "no-progress"
    assert "agent_tool.interrupted" in middle_events
    assert run_after is not None and run_after.step == 1


def test_a_child_step_commit_and_cancelling_its_agent_tool_run_do_not_deadlock(store: Store, pg_url: str) -> None:
    from threads_celery import Threads

    rows = _three_levels(store)
    middle_run = rows["middle_run"]
    client = Threads(database_url=pg_url, broker_url="memory://", migrate=False)
    pids: list[int] = []
    errors: list[BaseException] = []
    original_begin = client.store.transaction

    def remember_pid() -> Any:
        context = original_begin()
        tx = context.__enter__()
        pids.append(int(tx.conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
        return _Entered(context, tx)

    def cancel() -> None:
        try:
            client.cancel_agent_tool(rows["middle_row"].run_id, reason="stop")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    canceller = threading.Thread(target=cancel, name="cancel-agent-tool")
    now = run_ledger.utcnow()
    try:
        with store.transaction() as commit:
            moved = commit.advance_run(middle_run.id, fence=middle_run.fence, now=now, step=1)
            assert moved is not None
            commit.insert_message(
                thread_id=middle_run.thread_id, run_id=middle_run.id, role="assistant", text="thinking", now=now
            )
            client.store.transaction = remember_pid  # type: ignore[method-assign]
            canceller.start()

            def cancel_waits_on_the_commit() -> bool:
                if pids and _waiting_on_a_lock(store, pids[-1]):
                    return True
                assert canceller.is_alive(), f"the cancel ended without waiting on the commit: {errors}"
                return False

            eventually(
                cancel_waits_on_the_commit, timeout=WAIT_S, interval=0.02, what="the cancel reaching the commit's locks"
            )
            client.store.transaction = original_begin  # type: ignore[method-assign]
            agent_tools.child_signal(
                commit, rows["middle_row"].run_id, now, chunk={"role": "assistant", "text": "thinking"}
            )
        canceller.join(WAIT_S)
        assert not canceller.is_alive() and errors == []
        with store.read() as tx:
            middle_after = tx.get_run(middle_run.id)
            row_after = tx.get_agent_tool_run(rows["middle_row"].run_id)
        assert middle_after is not None and middle_after.status == "aborted" and middle_after.step == 1
        assert row_after is not None and row_after.status == "aborted"
    finally:
        client.close()


class _Entered:
    """A transaction context that was entered already (so the wrapper could read its pid)."""

    def __init__(self, context: Any, tx: Any) -> None:
        self.context, self.tx = context, tx

    def __enter__(self) -> Any:
        return self.tx

    def __exit__(self, *exc: object) -> Any:
        return self.context.__exit__(*exc)
