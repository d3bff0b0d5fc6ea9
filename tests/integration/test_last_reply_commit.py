"""A reply that ends its run commits with the run's end: what the separate statements wrote, or nothing.

On PostgreSQL the reply, its usage, its message and event, the run's end and its event are one
statement (``COMMIT_LAST_REPLY_PG``) in the transaction that then hands the thread on; elsewhere
(and here, forced, on PostgreSQL too) the statements of an ordinary reply commit and then the
run's end. Both must leave the same ledger: the same rows, the same fences, the same events in
the same order, the same next run woken.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from threads_celery import Agent, Permissions, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry
from threads_celery.runtime import step_commit
from threads_celery.runtime.machine import Runtime
from threads_celery.store import Store, create_store_engine, operations, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.store.operations import Reply, StepUsage, commit_last_reply_in
from threads_celery.store.repository import Tx
from threads_celery.store.schema import events, messages, model_usage, outbox, runs, threads
from threads_celery.testing import ScriptedModel, calls, say
from threads_celery.transitions import runs as run_ledger


class In(BaseModel):
    n: int


@pytest.fixture(params=["postgresql", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'l.db'}"
    store = Store(create_store_engine(parse_database_url(url)))
    upgrade(store.engine)
    yield store
    store.dispose()


def _agent(name: str, with_a_call: bool) -> Agent:
    noop = tool(name="noop", description="x", input=In, effect="read_only", execute=lambda inp, ctx: f"n={inp.n}")
    script = [calls(("noop", {"n": 1})), say("all done")] if with_a_call else [say("hello there")]
    return Agent(name=name, instructions="x", tools=[noop], permissions=Permissions.allow_all(),
                 model=ScriptedModel(script))  # fmt: skip


def _runtime(store: Store, agent: Agent) -> tuple[Runtime, list[OutboxEntry]]:
    registry = AgentRegistry()
    registry.add(agent)
    queue: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=queue.extend)
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), run_ledger.utcnow())
    return runtime, queue


def _submit(
    store: Store, agent: Agent, message: str, thread_id: str | None = None
) -> tuple[str, str, list[OutboxEntry]]:
    with store.transaction() as tx:
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message=message, now=run_ledger.utcnow(),
            thread_id=thread_id,
        )  # fmt: skip
    return run.id, run.thread_id, list(entries)


def _drive(runtime: Runtime, queue: list[OutboxEntry], first: list[OutboxEntry]) -> None:
    queue.extend(first)
    while queue:
        entry = queue.pop(0)
        (runtime.run_step if entry.task == "threads.step" else runtime.run_tool)(*entry.args)


def _separately(tx: Tx, reply: Reply) -> int | None:
    """The last reply's separate statements, whatever the store (those every store runs)."""
    dialect, tx.dialect = tx.dialect, "generic"
    try:
        return commit_last_reply_in(tx, reply)
    finally:
        tx.dialect = dialect


def _ledger(store: Store, thread_id: str) -> dict[str, Any]:
    """Everything a thread's runs wrote, with their ids and times replaced by their order."""
    with store.read() as tx:
        conn = tx.conn
        run_rows = conn.execute(select(runs).where(runs.c.thread_id == thread_id).order_by(runs.c.created_at)).all()
        names = {row.id: f"run{i}" for i, row in enumerate(run_rows)}

        def named(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: named(v) for k, v in value.items()}
            if isinstance(value, list):
                return [named(v) for v in value]
            if isinstance(value, str):
                for run_id, name in names.items():  # ids and the effect keys made of them
                    value = value.replace(run_id, name)
            return value

        thread = conn.execute(
            select(threads.c.active_run_id, threads.c.event_seq).where(threads.c.id == thread_id)
        ).one()
        return {
            "runs": [
                (
                    names[r.id],
                    r.status,
                    r.output,
                    r.error,
                    r.step,
                    r.fence,
                    r.lease_owner,
                    r.lease_expires_at,
                    r.finished_at is not None,
                    r.finished_at is None or r.finished_at == r.updated_at,
                )
                for r in run_rows
            ],
            "thread": (named(thread.active_run_id), thread.event_seq),
            "events": [
                (e.seq, e.type, named(e.run_id), named(dict(e.payload)))
                for e in conn.execute(select(events).where(events.c.thread_id == thread_id).order_by(events.c.seq))
            ],
            "messages": [
                (m.seq, named(m.run_id), m.role, m.text, named(m.parts))
                for m in conn.execute(
                    select(messages).where(messages.c.thread_id == thread_id).order_by(messages.c.seq)
                )
            ],
            "usage": [
                (named(u.run_id), u.step, u.agent, u.model, u.requests, u.input_tokens, u.output_tokens, u.cost)
                for u in conn.execute(
                    select(model_usage).where(model_usage.c.thread_id == thread_id).order_by(model_usage.c.step)
                )
            ],
            "outbox": sorted(
                named(str(o.key)) for o in conn.execute(select(outbox.c.key)) if str(o.key).startswith(tuple(names))
            ),
        }


@pytest.mark.parametrize("with_a_call", [False, True], ids=["a chat reply", "after a tool call"])
def test_the_last_reply_leaves_the_ledger_the_separate_statements_leave(
    store: Store, with_a_call: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledgers = []
    for generic in (False, True):
        agent = _agent("last", with_a_call)
        runtime, queue = _runtime(store, agent)
        with monkeypatch.context() as patch:
            if generic:
                patch.setattr(step_commit, "commit_last_reply_in", _separately)
            _run_id, thread_id, first = _submit(store, agent, "go")
            _drive(runtime, queue, first)
        ledger = _ledger(store, thread_id)
        assert ledger["runs"][0][1] == "completed", ledger["runs"]
        ledgers.append(ledger)
    assert ledgers[0] == ledgers[1]
    kinds = [e[1] for e in _ledger(store, thread_id)["events"]]
    assert kinds[-2:] == ["message", "run"]  # the reply's message, then the run's end


def test_the_run_queued_behind_is_woken_the_same_way(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ledgers = []
    for generic in (False, True):
        agent = _agent("queue", with_a_call=False)
        runtime, queue = _runtime(store, agent)
        with monkeypatch.context() as patch:
            if generic:
                patch.setattr(step_commit, "commit_last_reply_in", _separately)
            _first_run, thread_id, first = _submit(store, agent, "first")
            second_run, _, behind = _submit(store, agent, "second", thread_id=thread_id)
            assert behind == []  # queued behind the first
            step = first[0]
            runtime.run_step(*step.args)
            # The first run's end woke the second: its step is published, its message is in.
            assert [e.args[0] for e in queue] == [second_run]
            queue.clear()
        ledger = _ledger(store, thread_id)
        assert ledger["thread"][0] == "run1"
        assert [m[3] for m in ledger["messages"]] == ["first", "hello there", "second"]
        ledgers.append(ledger)
    assert ledgers[0] == ledgers[1]


def _usage() -> StepUsage:
    return StepUsage(agent="a", model="m", input_tokens=3, output_tokens=4, cost=None)


def test_a_stale_fence_writes_nothing(store: Store) -> None:
    agent = _agent("stale", with_a_call=False)
    _runtime(store, agent)
    run_id, thread_id, _first = _submit(store, agent, "go")
    before = _ledger(store, thread_id)
    with store.read() as tx:
        run = tx.get_run(run_id)
    assert run is not None
    now = run_ledger.utcnow() + timedelta(seconds=1)
    reply = Reply(run_id=run_id, thread_id=thread_id, fence=run.fence + 5, step=0, now=now, usage=_usage(),
                  text="late", tool_calls=(), call_rows=(), entries=())  # fmt: skip
    with store.transaction() as tx:
        assert commit_last_reply_in(tx, reply) is None
    assert _ledger(store, thread_id) == before


def test_a_reply_with_calls_is_not_a_last_reply(store: Store) -> None:
    reply = Reply(run_id="r", thread_id="t", fence=0, step=0, now=run_ledger.utcnow(), usage=_usage(), text="",
                  tool_calls=(), call_rows=({"effect_key": "r:0:0"},), entries=())  # fmt: skip
    with store.transaction() as tx, pytest.raises(ValueError, match="no tool calls"):
        commit_last_reply_in(tx, reply)


def test_unstorable_text_in_the_last_reply_is_stored_replaced(store: Store) -> None:
    agent = Agent(name="odd", instructions="x", model=ScriptedModel([say("a\x00b\ud800c")]))
    runtime, queue = _runtime(store, agent)
    _run_id, thread_id, first = _submit(store, agent, "go")
    _drive(runtime, queue, first)
    ledger = _ledger(store, thread_id)
    assert ledger["runs"][0][1:3] == ("completed", "a\ufffdb\ufffdc")
    assert ledger["messages"][-1][3] == "a\ufffdb\ufffdc"
    assert ledger["events"][-1][3]["output"] == "a\ufffdb\ufffdc"
    assert ledger["events"][-2][3]["text"] == "a\ufffdb\ufffdc"


def test_the_one_statement_is_what_postgresql_runs(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL the last reply is one statement; its separate statements are never run."""
    store = Store(create_store_engine(parse_database_url(pg_url)))
    upgrade(store.engine)
    ran: list[str] = []
    step_and_message = operations._step_and_message

    def noted(tx: Tx, reply: Reply) -> int | None:
        ran.append(reply.run_id)
        return step_and_message(tx, reply)

    monkeypatch.setattr(operations, "_step_and_message", noted)
    agent = _agent("pg-one", with_a_call=False)
    runtime, queue = _runtime(store, agent)
    _run_id, thread_id, first = _submit(store, agent, "go")
    _drive(runtime, queue, first)
    assert _ledger(store, thread_id)["runs"][0][1] == "completed"
    store.dispose()
    assert ran == []
