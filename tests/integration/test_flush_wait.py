"""Which commits wait for the disk, and what a delivery published by a commit that did not finds.

On PostgreSQL three one-statement commits return before their WAL reaches disk: a model step's
claim, a read_only call's result (reached in order), a ``tool_call_started`` event. Each one's
loss to a crash of PostgreSQL costs a repetition and nothing else, and ``flush_every_commit``
(THREADS_FLUSH_EVERY_COMMIT) makes them wait too. What a lost result had published (the next
call of the reply, or the next model step) finds the call before it unsettled and does nothing;
the call runs again from its outbox row. Those checks are the ledger's, so they hold on SQLite
as well.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, text

from threads_celery import Agent, Permissions, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry, Run
from threads_celery.runtime.machine import Runtime
from threads_celery.settings import Settings
from threads_celery.store import Store, create_store_engine, parse_database_url, statements
from threads_celery.store.direct import DirectStatements
from threads_celery.store.migrate import upgrade
from threads_celery.store.operations import commit_result_params
from threads_celery.store.schema import tool_calls
from threads_celery.testing import ScriptedModel, calls, say
from threads_celery.transitions import runs as run_ledger
from threads_celery.transitions.publishing import open_store

NO_FLUSH_WAIT = {
    id(statements.READ_AND_CLAIM_STEP_NO_FLUSH_WAIT_PG): "step claim",
    id(statements.COMMIT_CALL_RESULT_NO_FLUSH_WAIT_PG): "call result",
    id(statements.APPEND_EVENT_NO_FLUSH_WAIT_PG): "event",
}
WAITS = {
    id(statements.READ_AND_CLAIM_STEP_PG): "step claim",
    id(statements.COMMIT_CALL_RESULT_PG): "call result",
    id(statements.APPEND_EVENT_PG): "event",
    id(statements.CLAIM_CALL_PG): "call claim",
    id(statements.COMMIT_REPLY_PG): "reply",
}


class In(BaseModel):
    n: int


def _agent(name: str, *tool_names: str) -> tuple[Agent, list[int]]:
    """An agent whose first reply calls ``tool_names`` in order (each tool counts its runs), then says done."""
    ran: list[int] = []

    def execute(inp: In, _ctx: Any) -> str:
        ran.append(inp.n)
        return f"n={inp.n}"

    tools = [
        tool(name="look", description="read", input=In, effect="read_only", execute=execute),
        tool(name="send", description="write", input=In, effect="unguarded", execute=execute),
    ]
    reply = calls(*[(tool_name, {"n": n}) for n, tool_name in enumerate(tool_names)])
    agent = Agent(
        name=name,
        instructions="x",
        tools=tools,
        permissions=Permissions.allow_all(),
        model=ScriptedModel([reply, say("done")]),
    )
    return agent, ran


def _start(store: Store, agent: Agent) -> tuple[Runtime, Run, list[OutboxEntry]]:
    registry = AgentRegistry()
    registry.add(agent)
    queue: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=queue.extend, settings=Settings())
    now = run_ledger.utcnow()
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), now)
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message="go", now=now
        )
    queue.extend(entries)
    return runtime, run, queue


def _deliver(runtime: Runtime, entry: OutboxEntry) -> str:
    return (runtime.run_step if entry.task == run_ledger.STEP_TASK else runtime.run_tool)(*entry.args)


def _drive(runtime: Runtime, queue: list[OutboxEntry]) -> list[str]:
    outcomes = []
    while queue:
        outcomes.append(_deliver(runtime, queue.pop(0)))
    return outcomes


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    store = Store(create_store_engine(parse_database_url(pg_url)))
    upgrade(store.engine)
    yield store
    store.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def either_store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'ledger.db'}"
    store = Store(create_store_engine(parse_database_url(url)))
    upgrade(store.engine)
    yield store
    store.dispose()


# -- the statements --------------------------------------------------------------------------


def _synchronous_commit_after(store: Store, statement: Any, params: dict[str, Any]) -> tuple[Any, str, str]:
    """Run ``statement`` in a transaction of a connection of the engine's: what it returned, the
    ``synchronous_commit`` the transaction then has, and the one the next transaction has."""
    with store.engine.connect() as conn:
        with conn.begin() as tx:
            returned = conn.execute(statement, params).first()
            inside = conn.execute(text("SHOW synchronous_commit")).scalar_one()
            tx.rollback()
        after = conn.execute(text("SHOW synchronous_commit")).scalar_one()
        conn.rollback()
    return returned, inside, after


def test_the_commits_that_need_not_wait_turn_synchronous_commit_off_for_their_own_transaction_only(
    pg_store: Store,
) -> None:
    store = pg_store
    agent, _ = _agent("relaxed", "look", "look")
    runtime, run, queue = _start(store, agent)
    now = run_ledger.utcnow()
    step_params = {
        "run_id": run.id,
        "step": 0,
        "step_key": queue[0].key,
        "owner": "w",
        "until": now,
        "now": now,
        "payload": {"run_id": run.id, "status": "running"},
        "first_seq": -1,
        "last_seq": 0,
        "first_version": None,
        "last_version": None,
    }
    event_params = {"b_thread": run.thread_id, "b_run": run.id, "b_type": "x", "b_payload": {}, "b_now": now}
    default = _synchronous_commit_after(store, text("SELECT 1"), {})[1]
    assert default != "off"
    for relaxed, waits, params in (
        (statements.READ_AND_CLAIM_STEP_NO_FLUSH_WAIT_PG, statements.READ_AND_CLAIM_STEP_PG, step_params),
        (statements.APPEND_EVENT_NO_FLUSH_WAIT_PG, statements.APPEND_EVENT_PG, event_params),
    ):
        assert _synchronous_commit_after(store, waits, params)[1:] == (default, default)
        returned, inside, after = _synchronous_commit_after(store, relaxed, params)
        assert returned is not None  # it wrote (the claim came back, the event took a number)
        assert (inside, after) == ("off", default)

    assert _deliver(runtime, queue.pop(0)).startswith("called")
    call, current = store.call_and_run(queue[0].args[0])  # type: ignore[misc]
    result_params = commit_result_params(
        run_id=run.id,
        thread_id=run.thread_id,
        fence=current.fence,
        call=call,
        content="r",
        is_error=False,
        own_outbox=True,
        next_entry=None,
        now=now,
        next_due=now,
    )
    assert _synchronous_commit_after(store, statements.COMMIT_CALL_RESULT_PG, result_params)[1:] == (default, default)
    returned, inside, after = _synchronous_commit_after(
        store, statements.COMMIT_CALL_RESULT_NO_FLUSH_WAIT_PG, result_params
    )
    assert returned == (current.fence + 1,)
    assert (inside, after) == ("off", default)


@pytest.fixture
def statements_run(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the statements the hot path runs on the driver's cursor, in order."""
    seen: list[int] = []
    prepare = DirectStatements._prepare

    def recording(self: DirectStatements, statement: Any) -> Any:
        seen.append(id(statement))
        return prepare(self, statement)

    monkeypatch.setattr(DirectStatements, "_prepare", recording)
    return seen


def _kinds(seen: list[int], table: dict[int, str]) -> list[str]:
    return [table[s] for s in seen if s in table]


@pytest.mark.parametrize("flush_every_commit", [False, True])
def test_only_a_step_claim_a_read_only_result_and_a_started_event_skip_the_wait(
    pg_url: str, statements_run: list[int], flush_every_commit: bool
) -> None:
    store = Store(create_store_engine(parse_database_url(pg_url)), flush_every_commit=flush_every_commit)
    upgrade(store.engine)
    try:
        agent, ran = _agent("mixed", "look", "send")
        runtime, run, queue = _start(store, agent)
        _drive(runtime, queue)
        with store.read() as tx:
            final = tx.get_run(run.id)
        assert final is not None and final.status == "completed" and ran == [0, 1]
    finally:
        store.dispose()
    relaxed, waited = _kinds(statements_run, NO_FLUSH_WAIT), _kinds(statements_run, WAITS)
    if flush_every_commit:
        assert relaxed == []
        assert waited.count("step claim") == 2 and waited.count("call result") == 2
    else:
        # Two steps claimed and the read_only call's result (the calls' tool_call_started events
        # went with the reply, the model being quick).
        assert sorted(relaxed) == ["call result", "step claim", "step claim"]
        assert "step claim" not in waited
    # What a repetition cannot stand in for always waits: the unguarded call's claim and
    # result, the reply asking for the calls.
    assert waited.count("call claim") == 1 and waited.count("reply") == 1
    assert waited.count("call result") >= 1


def test_the_setting_reaches_the_store(pg_url: str) -> None:
    for value, expected in (("", False), ("true", True)):
        settings = Settings.from_env({"THREADS_FLUSH_EVERY_COMMIT": value})
        store = open_store(pg_url, settings)
        try:
            assert store.flush_every_commit is expected
        finally:
            store.dispose()


# -- deliveries published by a result that was taken back -------------------------------------


def _call_statuses(store: Store, run_id: str) -> list[str]:
    with store.read() as tx:
        query = select(tool_calls.c.status).where(tool_calls.c.run_id == run_id).order_by(tool_calls.c.idx)
        return list(tx.conn.execute(query).scalars())


def test_a_step_delivered_before_the_calls_of_its_reply_settled_does_nothing(either_store: Store) -> None:
    store = either_store
    agent, ran = _agent("early-step", "look", "look")
    runtime, run, queue = _start(store, agent)
    assert _deliver(runtime, queue.pop(0)).startswith("called")
    first_call = queue.pop(0)
    before = store.run(run.id)
    assert before is not None and before.step == 1

    # The step after the reply, as the last call's result would publish it, with no call settled.
    early = run_ledger.step_entry(before, 1, agent.name, None)
    assert _deliver(runtime, early) == "skipped: a call of the step before has not settled"
    after = store.run(run.id)
    assert after is not None
    assert (after.fence, after.lease_owner, after.status) == (before.fence, None, before.status)
    assert ran == [] and _call_statuses(store, run.id) == ["pending", "pending"]

    # The calls then run in order, and the step their last result publishes runs the model.
    queue.insert(0, first_call)
    _drive(runtime, queue)
    final = store.run(run.id)
    assert final is not None and final.status == "completed" and final.output == "done"
    assert ran == [0, 1]


def test_a_call_delivered_before_the_call_before_it_settled_does_nothing(either_store: Store) -> None:
    store = either_store
    agent, ran = _agent("early-call", "look", "send", "look")
    runtime, run, queue = _start(store, agent)
    _deliver(runtime, queue.pop(0))
    first_call = queue.pop(0)
    with store.read() as tx:
        keys = list(
            tx.conn.execute(
                select(tool_calls.c.effect_key).where(tool_calls.c.run_id == run.id).order_by(tool_calls.c.idx)
            ).scalars()
        )

    # The second call (unguarded), as the first call's result would publish it.
    assert runtime.run_tool(keys[1]) == "skipped: the call before it in its reply has not settled"
    assert ran == [] and _call_statuses(store, run.id) == ["pending", "pending", "pending"]

    queue.insert(0, first_call)
    _drive(runtime, queue)
    final = store.run(run.id)
    assert final is not None and final.status == "completed"
    assert ran == [0, 1, 2]  # in order, each once
    assert runtime.run_tool(keys[1]) == "skipped: run is completed"


def test_the_started_events_a_step_held_are_numbered_before_its_reply(either_store: Store) -> None:
    store = either_store
    agent, _ = _agent("numbered", "look", "send", "look")
    runtime, run, queue = _start(store, agent)
    _drive(runtime, queue)
    with store.read() as tx:
        events = tx.list_events(run.thread_id)
    assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
    kinds = [(e.type, e.payload.get("role"), e.payload.get("call_id")) for e in events]
    reply = next(i for i, k in enumerate(kinds) if k[1] == "assistant")
    started = [k for k in kinds[:reply] if k[0] == "tool_call_started"]
    assert len(started) == 3 and [e.payload["effect_key"] for e in events[reply - 3 : reply]] == [
        run_ledger.effect_key_for(run.id, 0, i) for i in range(3)
    ]
    assert kinds[reply - 3 : reply] == started
