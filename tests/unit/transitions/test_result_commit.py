"""The one result commit on SQLite: the fence is checked, and a result is all or nothing.

PostgreSQL runs the same store operation as one statement (tests/integration/test_result_commit_pg.py);
here it is one statement per row in one transaction, and must keep the same guarantees.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from threads_celery import Agent, Permissions, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import FenceLost
from threads_celery.records import OutboxEntry
from threads_celery.runtime.machine import Runtime
from threads_celery.runtime.outcomes import commit_call
from threads_celery.settings import Settings
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import outbox, tool_calls
from threads_celery.testing import ScriptedModel, calls, say
from threads_celery.transitions import runs as run_ledger


class In(BaseModel):
    n: int


def _maybe_fail(inp: In, ctx: Any) -> str:
    if inp.n == 2:
        raise ValueError("two is not allowed")
    return f"n={inp.n}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(create_store_engine(parse_database_url(f"sqlite:///{tmp_path / 'ledger.db'}")))
    upgrade(store.engine)
    yield store
    store.dispose()


def _setup(store: Store) -> tuple[Runtime, Any, list[OutboxEntry]]:
    noop = tool(name="noop", description="x", input=In, effect="read_only", execute=_maybe_fail)
    agent = Agent(
        name="one-read-only",
        instructions="x",
        tools=[noop],
        permissions=Permissions.allow_all(),
        model=ScriptedModel([calls(*[("noop", {"n": n}) for n in range(4)]), say("done")]),
    )
    registry = AgentRegistry()
    registry.add(agent)
    published: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=published.extend, settings=Settings())
    now = run_ledger.utcnow()
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), now)
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message="go", now=now
        )
    published.extend(entries)
    return runtime, run, published


def test_a_run_driven_through_the_result_commit_has_a_consistent_ledger(store: Store) -> None:
    runtime, run, queue = _setup(store)
    while queue:
        entry = queue.pop(0)
        (runtime.run_step if entry.task == "threads.step" else runtime.run_tool)(*entry.args)
    with store.read() as tx:
        final = tx.get_run(run.id)
        messages = tx.list_messages(run.thread_id)
        events = tx.list_events(run.thread_id)
        rows = tx.conn.execute(select(tool_calls.c.status, tool_calls.c.result).order_by(tool_calls.c.idx)).all()
        left = tx.conn.execute(select(outbox.c.key)).all()
    assert final is not None and (final.status, final.output) == ("completed", "done")
    assert [(m.seq, m.role) for m in messages] == [
        (0, "user"), (1, "assistant"), (2, "tool"), (3, "tool"), (4, "tool"), (5, "tool"), (6, "assistant")
    ]  # fmt: skip
    assert [m.text for m in messages if m.role == "tool"] == ["n=0", "n=1", "ValueError: two is not allowed", "n=3"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    tool_events = [e.payload for e in events if e.type == "message" and e.payload["role"] == "tool"]
    assert [(p["seq"], p["text"], p["tool_result"]["is_error"]) for p in tool_events] == [
        (2, "n=0", False), (3, "n=1", False), (4, "ValueError: two is not allowed", True), (5, "n=3", False)
    ]  # fmt: skip
    assert rows == [
        ("completed", "n=0"),
        ("completed", "n=1"),
        ("error", "ValueError: two is not allowed"),
        ("completed", "n=3"),
    ]
    assert left == []


def test_a_stale_fence_writes_nothing(store: Store) -> None:
    runtime, run, queue = _setup(store)
    runtime.run_step(*queue.pop(0).args)
    [entry] = queue
    with store.read() as tx:
        found = tx.get_call_and_run(entry.args[0])
        assert found is not None
        call, current = found
        before = (len(tx.list_messages(run.thread_id)), len(tx.list_events(run.thread_id)))
    with pytest.raises(FenceLost):
        commit_call(runtime, current, current.fence - 1, call, None, "late", is_error=False, own_outbox=True)
    with store.read() as tx:
        after = (len(tx.list_messages(run.thread_id)), len(tx.list_events(run.thread_id)))
        after_call = tx.get_call_and_run(entry.args[0])
        assert after_call is not None and after_call[0].status == "pending"
        assert [r.key for r in tx.conn.execute(select(outbox.c.key))] == [entry.key]
    assert after == before


def test_a_result_whose_next_task_cannot_be_recorded_writes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outbox row of what runs next is in the result's transaction: no result without it."""
    runtime, run, queue = _setup(store)
    runtime.run_step(*queue.pop(0).args)
    [entry] = queue
    with store.read() as tx:
        found = tx.get_call_and_run(entry.args[0])
        assert found is not None
        call, current = found
        before = (len(tx.list_messages(run.thread_id)), len(tx.list_events(run.thread_id)))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the outbox refused the row")

    monkeypatch.setattr("threads_celery.store.repository.Tx.insert_outbox", refuse)
    with pytest.raises(RuntimeError, match="the outbox refused"):
        commit_call(runtime, current, current.fence, call, None, "n=0", is_error=False, own_outbox=True)
    monkeypatch.undo()
    with store.read() as tx:
        after = (len(tx.list_messages(run.thread_id)), len(tx.list_events(run.thread_id)))
        after_found = tx.get_call_and_run(entry.args[0])
        assert after_found is not None
        assert (after_found[0].status, after_found[1].fence) == ("pending", current.fence)
        assert [r.key for r in tx.conn.execute(select(outbox.c.key))] == [entry.key]
    assert after == before
