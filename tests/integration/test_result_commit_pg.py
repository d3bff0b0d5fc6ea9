"""PostgreSQL's one-statement result commit writes what the generic path writes, or nothing."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from threads_celery import Agent, Permissions, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import FenceLost
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


def _maybe_fail(inp: In, ctx) -> str:
    if inp.n == 2:
        raise ValueError("two is not allowed")
    return f"n={inp.n}"


@pytest.fixture
def runtime(pg_url: str):
    store = Store(create_store_engine(parse_database_url(pg_url)))
    upgrade(store.engine)
    yield store
    store.dispose()


def _setup(store: Store, effect: str):
    noop = tool(
        name="noop",
        description="x",
        input=In,
        effect=effect,
        execute=_maybe_fail,
        **({"dedup_window_ms": 60_000} if effect == "idempotent" else {}),
    )
    agent = Agent(
        name=f"one-{effect}",
        instructions="x",
        tools=[noop],
        permissions=Permissions.allow_all(),
        model=ScriptedModel([calls(*[("noop", {"n": n}) for n in range(4)]), say("done")]),
    )
    registry = AgentRegistry()
    registry.add(agent)
    published: list = []
    rt = Runtime(store, registry, publish=published.extend, settings=Settings())
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), run_ledger.utcnow())
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message="go", now=run_ledger.utcnow()
        )
    published.extend(entries)
    return rt, run, published


@pytest.mark.parametrize("effect", ["read_only", "idempotent"])
def test_a_run_driven_through_the_one_statement_commit_has_a_consistent_ledger(runtime: Store, effect: str) -> None:
    rt, run, queue = _setup(runtime, effect)
    while queue:
        entry = queue.pop(0)
        (rt.run_step if entry.task == "threads.step" else rt.run_tool)(*entry.args)
    with runtime.read() as tx:
        final = tx.get_run(run.id)
        messages = tx.list_messages(run.thread_id)
        events = tx.list_events(run.thread_id)
        rows = tx.conn.execute(select(tool_calls.c.status, tool_calls.c.result).order_by(tool_calls.c.idx)).all()
        left = tx.conn.execute(select(outbox.c.key)).all()
    assert final.status == "completed" and final.output == "done"
    assert [(m.seq, m.role) for m in messages] == [
        (0, "user"),
        (1, "assistant"),
        (2, "tool"),
        (3, "tool"),
        (4, "tool"),
        (5, "tool"),
        (6, "assistant"),
    ]
    assert [m.text for m in messages if m.role == "tool"] == ["n=0", "n=1", "ValueError: two is not allowed", "n=3"]
    assert [m.tool_result.is_error for m in messages if m.role == "tool"] == [False, False, True, False]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    tool_events = [e.payload for e in events if e.type == "message" and e.payload["role"] == "tool"]
    assert [(p["seq"], p["text"], p["tool_result"]["is_error"]) for p in tool_events] == [
        (2, "n=0", False),
        (3, "n=1", False),
        (4, "ValueError: two is not allowed", True),
        (5, "n=3", False),
    ]
    assert rows == [
        ("completed", "n=0"),
        ("completed", "n=1"),
        ("error", "ValueError: two is not allowed"),
        ("completed", "n=3"),
    ]
    assert left == []


def test_a_stale_fence_writes_nothing(runtime: Store) -> None:
    rt, run, queue = _setup(runtime, "read_only")
    rt.run_step(*queue.pop(0).args)
    [entry] = queue
    with runtime.read() as tx:
        call, current = tx.get_call_and_run(entry.args[0])
        before = (len(tx.list_messages(run.thread_id)), len(tx.list_events(run.thread_id)))
    with pytest.raises(FenceLost):
        commit_call(rt, current, current.fence - 1, call, None, "late", is_error=False, own_outbox=True)
    with runtime.read() as tx:
        after = (len(tx.list_messages(run.thread_id)), len(tx.list_events(run.thread_id)))
        assert tx.get_call_and_run(entry.args[0])[0].status == "pending"
        assert [r.key for r in tx.conn.execute(select(outbox.c.key))] == [entry.key]
    assert after == before


def test_the_one_statement_claim_writes_what_the_claim_transaction_writes(runtime: Store) -> None:
    rt, _run, queue = _setup(runtime, "idempotent")
    rt.run_step(*queue.pop(0).args)
    [entry] = queue
    with runtime.read() as tx:
        call, current = tx.get_call_and_run(entry.args[0])
    now = run_ledger.utcnow()
    fence = rt._claim_call(current, call, now)
    assert fence == current.fence + 1
    with runtime.read() as tx:
        claimed_call, claimed_run = tx.get_call_and_run(entry.args[0])
        assert tx.conn.execute(select(outbox.c.key)).all() == []
    assert (claimed_run.fence, claimed_run.status, claimed_run.lease_owner) == (fence, "running", rt.worker_id)
    assert claimed_run.lease_expires_at is not None and claimed_run.lease_expires_at > now
    assert (claimed_call.status, claimed_call.attempt) == ("started", call.attempt + 1)
    assert claimed_call.first_started_at is not None


def test_a_one_statement_claim_with_a_stale_fence_writes_nothing(runtime: Store) -> None:
    rt, _run, queue = _setup(runtime, "idempotent")
    rt.run_step(*queue.pop(0).args)
    [entry] = queue
    with runtime.read() as tx:
        call, current = tx.get_call_and_run(entry.args[0])
    stale = current.__class__(
        **{**{f: getattr(current, f) for f in current.__dataclass_fields__}, "fence": current.fence - 1}
    )
    assert rt._claim_call(stale, call, run_ledger.utcnow()) is None
    with runtime.read() as tx:
        after_call, after_run = tx.get_call_and_run(entry.args[0])
        assert [r.key for r in tx.conn.execute(select(outbox.c.key))] == [entry.key]
    assert (after_call.status, after_call.attempt, after_run.fence) == ("pending", call.attempt, current.fence)
