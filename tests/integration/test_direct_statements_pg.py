"""A tool call's own statements on the driver's cursor (``store/direct.py``), on PostgreSQL.

They must mean exactly what they mean through the engine: the same rows read, the same fenced
writes, the same storable text, the same errors. Their connections must survive what the
engine's pool survives: a server that drops them, threads, a fork.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import pytest
from pydantic import BaseModel
from pydantic_ai.messages import ModelResponse, UserPromptPart
from pydantic_ai.models.function import DeltaToolCall, FunctionModel
from sqlalchemy import select, text
from sqlalchemy.exc import DataError

from threads_celery import Agent, Permissions, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import StoreUnavailable
from threads_celery.records import OutboxEntry, Run, ToolCall, ToolResult
from threads_celery.runtime.machine import Runtime
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store import direct as direct_module
from threads_celery.store.migrate import upgrade
from threads_celery.store.operations import ClaimedStep
from threads_celery.store.schema import events, messages, outbox, runs, tool_calls
from threads_celery.testing import ScriptedModel, calls, say
from threads_celery.transitions import runs as run_ledger

BACKEND_PID = text("SELECT pg_backend_pid()")


class In(BaseModel):
    n: int


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    store = Store(create_store_engine(parse_database_url(pg_url)))
    upgrade(store.engine)
    yield store
    store.dispose()


def _start(store: Store, agent: Agent, message: str) -> tuple[Runtime, Run, list[OutboxEntry]]:
    """A runtime for ``agent`` publishing into a list, and a run submitted: (runtime, run, queue)."""
    registry = AgentRegistry()
    registry.add(agent)
    queue: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=queue.extend)
    now = run_ledger.utcnow()
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), now)
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message=message, now=now
        )
    queue.extend(entries)
    return runtime, run, queue


def _reply_of_three(store: Store) -> tuple[str, list[str]]:
    """A run whose model reply asked for three calls: (run id, their effect keys in order)."""
    noop = tool(
        name="noop",
        description="x",
        input=In,
        effect="idempotent",
        dedup_window_ms=60_000,
        execute=lambda inp, ctx: "ok",
    )
    agent = Agent(name="direct", instructions="x", tools=[noop], permissions=Permissions.allow_all(),
                  model=ScriptedModel([calls(*[("noop", {"n": n}) for n in range(3)]), say("done")]))  # fmt: skip
    runtime, run, entries = _start(store, agent, "go")
    run_id, step = entries[0].args
    runtime.run_step(run_id, step)
    with store.read() as tx:
        keys = [c.effect_key for c in tx.calls_in_step(run.id, step)]
    assert len(keys) == 3
    return run.id, keys


def _without_texts(run: Run) -> Run:
    """``run`` as a worker's hot path reads it: without its input, output and error."""
    return dataclasses.replace(run, input="", output=None, error=None)


def test_the_call_and_its_run_read_directly_equal_the_engines_read(store: Store) -> None:
    # The hot read leaves the run's texts out (a long prompt is not read again by every call).
    _run_id, keys = _reply_of_three(store)
    for key in keys:
        direct = store.call_and_run(key)
        with store.read() as tx:
            engine = tx.get_call_and_run(key)
        assert engine is not None and engine[1].input != ""
        assert direct == (engine[0], _without_texts(engine[1]))
        assert direct is not None and direct[1].created_at is not None
        assert direct[1].created_at.tzinfo is UTC  # UTCDateTime's conversion applied
    first, _run = store.call_and_run(keys[0])  # type: ignore[misc]
    last, _run = store.call_and_run(keys[2])  # type: ignore[misc]
    assert first.next_call is not None and first.next_call[0] == keys[1]
    assert last.next_call is None
    assert store.call_and_run("no-such-call") is None


def test_a_narrated_line_ends_with_its_text_though_the_claim_reads_no_text(store: Store) -> None:
    # A step's claim returns the run without its input; the narrated line reads it for its output.
    agent = Agent(name="narrated_direct", instructions="x", model=ScriptedModel([say("never asked")]))
    registry = AgentRegistry()
    registry.add(agent)
    queue: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=queue.extend)
    line = "sources gathered: " + "x" * 5000
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), run_ledger.utcnow())
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message=line, now=run_ledger.utcnow(),
            input_meta={"narrate": True},
        )  # fmt: skip
    claimed = store.read_and_claim_step(
        run.id, 0, entries[0].key, owner="w0", lease_until=run_ledger.utcnow() - timedelta(seconds=1),
        now=run_ledger.utcnow() - timedelta(seconds=2),
    )  # fmt: skip
    assert claimed is not None and claimed.run.input == "" and claimed.run.input_meta == {"narrate": True}
    assert [m.text for m in claimed.messages] == [line]  # its message is in the thread already
    assert runtime.run_step(run.id, 0) == "narrated"  # the lease above has expired: taken over
    ended = store.run(run.id)
    assert ended is not None and (ended.status, ended.output) == ("completed", line)


def test_a_history_read_directly_equals_the_engines_read(store: Store) -> None:
    """The whole thread and its two ends, as a model step reads them: the same messages, JSON
    parts, metadata, times and text (a result holding what had to be made storable included)."""
    echo = tool(name="echo", description="x", input=In, effect="read_only", execute=lambda inp, ctx: f"é\x00{inp.n}")
    agent = Agent(name="history_direct", instructions="x", tools=[echo],
                  model=ScriptedModel([calls(("echo", {"n": 1}), ("echo", {"n": 2})), say("done ✓")]))  # fmt: skip
    runtime, run, queue = _start(store, agent, "go \ud800 now")
    while queue:
        entry = queue.pop(0)
        (runtime.run_step if entry.task == "threads.step" else runtime.run_tool)(*entry.args)
    with store.read() as tx:
        engine_all = tx.list_messages(run.thread_id)
        engine_ends = tx.list_message_ends(run.thread_id, first_seq=0, last_seq=2)
    assert [m.role for m in engine_all] == ["user", "assistant", "tool", "tool", "assistant"]
    assert store.list_messages(run.thread_id) == engine_all
    assert store.list_message_ends(run.thread_id, first_seq=0, last_seq=2) == engine_ends
    assert [m.seq for m in engine_ends] == [0, 2, 3, 4]
    assert engine_all[2].tool_result is not None and engine_all[2].tool_result.content == "é\ufffd1"
    assert all(m.created_at.utcoffset() == timedelta(0) for m in store.list_messages(run.thread_id))
    assert store.list_messages("no-such-thread") == []


def test_a_claim_and_a_commit_are_fenced_and_write_storable_text(store: Store) -> None:
    run_id, keys = _reply_of_three(store)
    call, run = store.call_and_run(keys[0])  # type: ignore[misc]
    now = datetime.now(UTC)
    until = now + timedelta(seconds=30)
    assert (
        store.claim_call_and_run(run_id, call.effect_key, fence=run.fence + 7, owner="w", lease_until=until, now=now)
        is None
    )
    claimed = store.claim_call_and_run(run_id, call.effect_key, fence=run.fence, owner="w", lease_until=until, now=now)
    assert claimed == run.fence + 1
    with store.read() as tx:
        row = tx.conn.execute(select(tool_calls.c.status, tool_calls.c.attempt, tool_calls.c.lease_owner)
                              .where(tool_calls.c.effect_key == call.effect_key)).one()  # fmt: skip
        lease = tx.conn.execute(select(runs.c.lease_expires_at).where(runs.c.id == run_id)).scalar_one()
    assert tuple(row) == ("started", 1, "w")
    assert lease == until

    following = OutboxEntry(key=keys[1], task="threads.tool", args=(keys[1],))
    common = {"run_id": run_id, "thread_id": run.thread_id, "call": call, "is_error": False,
              "own_outbox": False, "next_entry": following, "now": now}  # fmt: skip
    assert store.commit_call_result(fence=claimed - 1, content="stale", **common) is None
    moved = store.commit_call_result(fence=claimed, content="a\x00b\ud800c", **common)
    assert moved == claimed + 1
    with store.read() as tx:
        result = tx.conn.execute(
            select(tool_calls.c.result).where(tool_calls.c.effect_key == call.effect_key)
        ).scalar_one()
        texts = tx.conn.execute(select(messages.c.text).where(messages.c.role == "tool")).scalars().all()
        payloads = [p for p in tx.conn.execute(select(events.c.payload)).scalars() if p.get("role") == "tool"]
        queued = tx.conn.execute(select(outbox.c.key, outbox.c.task)).all()
    assert result == "a\ufffdb\ufffdc"
    assert texts == ["a\ufffdb\ufffdc"]
    assert [p["text"] for p in payloads] == ["a\ufffdb\ufffdc"]
    assert (keys[1], "threads.tool") in [tuple(q) for q in queued]


def test_a_connection_dropped_while_idle_is_replaced_before_a_statement_goes_out_on_it(store: Store) -> None:
    direct = store._direct
    assert direct is not None
    pid = direct.scalar(BACKEND_PID, {})
    with store.transaction() as tx:  # waits until the backend has ended (PostgreSQL 14 and later)
        assert tx.conn.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid}).scalar()
    assert direct.scalar(BACKEND_PID, {}) != pid  # a new connection, no error, no restart needed


def test_a_connection_dropped_under_a_statement_is_unavailable_once_then_replaced(store: Store) -> None:
    direct = store._direct
    assert direct is not None
    pid = direct.scalar(BACKEND_PID, {})
    with store.transaction() as tx:
        tx.conn.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
    # Seen as open (as when the server ends it after the look and before the statement).
    with (
        patch.object(direct_module, "_still_open", lambda _connection: True),
        pytest.raises(StoreUnavailable) as raised,
    ):
        direct.scalar(BACKEND_PID, {})
    assert "cannot reach the database" in str(raised.value)
    assert direct.scalar(BACKEND_PID, {}) != pid


def test_a_server_that_is_not_there_is_unavailable_not_the_drivers_error(pg_url: str) -> None:
    # Opening a connection fails (the pool hands back psycopg's own OperationalError): the hot
    # path must still raise StoreUnavailable, which a worker holding a tool's result waits out.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    url = parse_database_url(pg_url).set(port=free_port)
    gone = Store(create_store_engine(url))
    try:
        assert gone._direct is not None
        with pytest.raises(StoreUnavailable) as raised:
            gone.run("run_missing")
        assert "cannot reach the database" in str(raised.value)
        with pytest.raises(StoreUnavailable):
            gone.call_and_run("run_missing:0:0")
    finally:
        gone.dispose()


def test_a_refused_statement_raises_the_engines_error_and_keeps_the_connection(store: Store) -> None:
    direct = store._direct
    assert direct is not None
    pid = direct.scalar(BACKEND_PID, {})
    with pytest.raises(DataError) as raised:
        direct.scalar(text("SELECT CAST(:v AS integer)"), {"v": "not a number"})
    assert "not a number" not in str(raised.value).split("[SQL:")[1]  # parameters hidden, as on the engine
    assert direct.scalar(BACKEND_PID, {}) == pid


def test_threads_each_take_a_connection_of_their_own(store: Store) -> None:
    direct = store._direct
    assert direct is not None
    inside = threading.Barrier(4)
    pids: list[int] = []

    def work() -> None:
        # Two statements per thread, one of them while all four threads hold a connection.
        pids.append(
            direct.scalar(text("SELECT pg_backend_pid() FROM pg_sleep(0) WHERE :go"), {"go": bool(inside.wait() + 1)})
        )

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(pids) == 4
    assert len(direct._idle) <= 4  # given back, none leaked


def _in_child(url: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = _CHILD_STORE
    try:
        queue.put(store._direct.scalar(BACKEND_PID, {}))  # type: ignore[union-attr]
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        queue.put(repr(exc))


_CHILD_STORE: Store


def test_a_forked_child_opens_its_own_and_leaves_the_parents_alone(store: Store) -> None:
    global _CHILD_STORE
    direct = store._direct
    assert direct is not None
    parent_pid = direct.scalar(BACKEND_PID, {})  # one idle connection now, inherited by the child
    _CHILD_STORE = store
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=("", queue))
    child.start()
    child_pid = queue.get(timeout=30)
    child.join(timeout=30)
    assert isinstance(child_pid, int) and child_pid != parent_pid
    assert direct.scalar(BACKEND_PID, {}) == parent_pid  # the parent's session is still whole


def test_an_event_appended_on_its_own_takes_the_threads_next_sequence_number(store: Store) -> None:
    run_id, _keys = _reply_of_three(store)
    with store.read() as tx:
        thread_id = tx.get_run(run_id).thread_id  # type: ignore[union-attr]
        before = [e.seq for e in tx.list_events(thread_id)]
    now = datetime.now(UTC)
    first = store.append_event(thread_id, run_id, "tool_call_started", {"name": "x\x00"}, now)
    with store.transaction() as tx:
        second = tx.append_event(thread_id, run_id, "run", {"status": "running"}, now)
    third = store.append_event(thread_id, run_id, "tool_call_started", {"name": "y"}, now)
    assert (first, second, third) == (before[-1] + 1, before[-1] + 2, before[-1] + 3)
    with store.read() as tx:
        appended = tx.list_events(thread_id, after=before[-1])
    assert [(e.seq, e.type, e.payload) for e in appended] == [
        (first, "tool_call_started", {"name": "x\ufffd"}),
        (second, "run", {"status": "running"}),
        (third, "tool_call_started", {"name": "y"}),
    ]
    assert all(e.created_at == now for e in appended)


@pytest.fixture(params=["postgresql", "sqlite"])
def either_store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'ledger.db'}"
    store = Store(create_store_engine(parse_database_url(url)))
    upgrade(store.engine)
    yield store
    store.dispose()


def _queued_run(store: Store) -> tuple[str, str]:
    """A queued run and its first step's outbox key, nothing claimed yet."""
    now = run_ledger.utcnow()
    with store.transaction() as tx:
        tx.upsert_agent("claims", "h", {}, now)
        run, entries = run_ledger.submit_run(tx, agent="claims", config_hash="h", message="go", now=now)
    return run.id, entries[0].key


def _outbox_and_run_events(store: Store, run_id: str) -> tuple[list[str], list[dict]]:
    with store.read() as tx:
        keys = tx.outbox_keys()
        thread_id = tx.get_run(run_id).thread_id  # type: ignore[union-attr]
        statuses = [e.payload for e in tx.list_events(thread_id) if e.type == "run"]
    return keys, statuses


def test_a_step_claim_takes_the_lease_consumes_the_step_and_says_running_once(either_store: Store) -> None:
    store = either_store
    run_id, step_key = _queued_run(store)
    run = store.run(run_id)
    assert run is not None and run.status == "queued"
    now = datetime.now(UTC)
    fence = store.claim_step(run, step_key, owner="w1", lease_until=now + timedelta(seconds=30), now=now)
    assert fence == run.fence + 1
    claimed = store.run(run_id)
    assert claimed is not None
    assert (claimed.status, claimed.fence, claimed.lease_owner) == ("running", fence, "w1")
    keys, statuses = _outbox_and_run_events(store, run_id)
    assert step_key not in keys
    assert statuses.count({"run_id": run_id, "status": "running"}) == 1
    # The next step's claim, by the same worker after its lease was released: no second event.
    with store.transaction() as tx:
        released = tx.advance_run(run_id, fence=fence, now=now, lease_owner=None, lease_expires_at=None)
    again = store.run(run_id)
    assert again is not None and again.fence == released
    assert (
        store.claim_step(again, "step:other", owner="w1", lease_until=now + timedelta(seconds=30), now=now)
        == released + 1
    )  # type: ignore[operator]
    assert _outbox_and_run_events(store, run_id)[1].count({"run_id": run_id, "status": "running"}) == 1


def test_a_step_claim_on_a_moved_fence_or_a_live_lease_writes_nothing(either_store: Store) -> None:
    store = either_store
    run_id, step_key = _queued_run(store)
    read = store.run(run_id)
    assert read is not None
    now = datetime.now(UTC)
    lease = now + timedelta(seconds=30)
    # Another worker claims first: the fence this worker read has moved.
    assert store.claim_step(read, step_key, owner="w1", lease_until=lease, now=now) is not None
    assert store.claim_step(read, step_key, owner="w2", lease_until=lease, now=now) is None
    # Read again, the fence is current but w1's lease is live.
    current = store.run(run_id)
    assert current is not None
    assert store.claim_step(current, step_key, owner="w2", lease_until=lease, now=now) is None
    after = store.run(run_id)
    assert after == current  # nothing written
    # Once w1's lease has expired, w2 takes the run over.
    later = lease + timedelta(seconds=1)
    assert (
        store.claim_step(current, step_key, owner="w2", lease_until=later + timedelta(seconds=30), now=later)
        == current.fence + 1
    )
    assert _outbox_and_run_events(store, run_id)[1].count({"run_id": run_id, "status": "running"}) == 1


def _drive(store: Store, message: str, *, tasks: int | None = None) -> str:
    """One run of a three-reply script, in-process, to completion or for ``tasks`` tasks: its run id."""

    def work(inp: In, ctx) -> str:
        if inp.n == 2:
            raise ValueError("two is not allowed")
        return f"n={inp.n}\x00"

    ro = tool(name="ro", description="x", input=In, effect="read_only", execute=work)
    same = tool(name="same", description="x", input=In, effect="idempotent", dedup_window_ms=60_000, execute=work)
    wide = tool(name="wide", description="x", input=In, effect="read_only", concurrent=True, execute=work)
    agent = Agent(
        name="parity", instructions="x", tools=[ro, same, wide], permissions=Permissions.allow_all(),
        model=ScriptedModel([calls(("ro", {"n": 1}), ("same", {"n": 2}), ("same", {"n": 3})),
                             calls(("wide", {"n": 4}), ("wide", {"n": 5}), ("wide", {"n": 6})),
                             say("done\x00")]),
    )  # fmt: skip
    runtime, run, queue = _start(store, agent, message)
    while queue and (tasks is None or tasks > 0):
        tasks = None if tasks is None else tasks - 1
        entry = queue.pop(0)
        (runtime.run_step if entry.task == "threads.step" else runtime.run_tool)(*entry.args)
    return run.id


def _ledger(store: Store, run_id: str) -> str:
    """What the run left in the ledger, without ids, times and leases, its own ids made generic."""
    from threads_celery.store.schema import model_usage

    with store.read() as tx:
        run = tx.get_run(run_id)
        assert run is not None
        c = tool_calls.c
        rows = {
            "run": [run.status, run.step, run.fence, run.output, run.error, run.lease_owner],
            "messages": [list(r) for r in tx.conn.execute(
                select(messages.c.seq, messages.c.role, messages.c.text, messages.c.parts)
                .where(messages.c.thread_id == run.thread_id).order_by(messages.c.seq))],
            "events": [[e.seq, e.type, e.payload] for e in tx.list_events(run.thread_id)],
            "calls": [list(r) for r in tx.conn.execute(
                select(c.effect_key, c.step, c.idx, c.calls_in_step, c.call_id, c.tool, c.args, c.args_hash, c.effect,
                       c.dedup_window_ms, c.finality, c.queue, c.status, c.attempt, c.result, c.is_error, c.batch)
                .where(c.run_id == run_id).order_by(c.step, c.idx))],
            "usage": [list(r) for r in tx.conn.execute(
                select(model_usage.c.step, model_usage.c.agent, model_usage.c.model, model_usage.c.requests,
                       model_usage.c.input_tokens, model_usage.c.output_tokens, model_usage.c.cost)
                .where(model_usage.c.run_id == run_id).order_by(model_usage.c.step))],
            "outbox": [[r.key, r.task, r.args, r.queue, r.argsrepr, r.publish_count,
                        (r.due_at - r.created_at).total_seconds()] for r in tx.conn.execute(
                select(outbox).where(outbox.c.key.contains(run_id)).order_by(outbox.c.key))],
        }  # fmt: skip
    import json

    text = json.dumps(rows, sort_keys=True, default=str, ensure_ascii=False)
    return text.replace(run_id, "RUN").replace(run.thread_id, "THREAD")


def test_the_direct_path_leaves_the_ledger_the_engine_path_leaves(pg_url: str) -> None:
    stores = [Store(create_store_engine(parse_database_url(pg_url)), direct=d) for d in (True, False)]
    upgrade(stores[0].engine)
    try:
        direct, engine = (_ledger(s, _drive(s, "go")) for s in stores)
    finally:
        for s in stores:
            s.dispose()
    assert "n=1\ufffd" in direct and "done\ufffd" in direct and "two is not allowed" in direct
    assert direct == engine


@pytest.mark.parametrize("tasks", [1, 4, 5])
def test_after_a_reply_the_outbox_holds_what_the_engine_path_holds(pg_url: str, tasks: int) -> None:
    # After the first reply (one call queued), after the second (a wave of concurrent calls
    # queued) and midway through that wave: what the backbone would publish again is the same.
    stores = [Store(create_store_engine(parse_database_url(pg_url)), direct=d) for d in (True, False)]
    upgrade(stores[0].engine)
    try:
        direct, engine = (_ledger(s, _drive(s, "go", tasks=tasks)) for s in stores)
    finally:
        for s in stores:
            s.dispose()
    assert '"outbox": [["' in direct  # something is queued at this point
    assert direct == engine


def test_a_due_step_is_read_and_claimed_in_one_statement_as_apart(store: Store) -> None:
    run_id, step_key = _queued_run(store)
    before = store.run(run_id)
    assert before is not None
    now = datetime.now(UTC)
    lease = now + timedelta(seconds=30)
    # Not due: another step, then (below) a live lease and a run that ended. Nothing written.
    assert store.read_and_claim_step(run_id, 1, "step:x:1", owner="w1", lease_until=lease, now=now) is None
    assert store.run(run_id) == before
    read = store.read_and_claim_step(run_id, 0, step_key, owner="w1", lease_until=lease, now=now)
    assert read is not None and read.run == _without_texts(before)  # the run as it was before the claim
    assert [(m.seq, m.role, m.text) for m in read.messages] == [(0, "user", "go")]  # and its history
    claimed = store.run(run_id)
    assert claimed is not None
    assert (claimed.status, claimed.fence, claimed.lease_owner) == ("running", before.fence + 1, "w1")
    keys, statuses = _outbox_and_run_events(store, run_id)
    assert step_key not in keys
    assert statuses.count({"run_id": run_id, "status": "running"}) == 1
    # w1's lease is live: w2 reads and claims nothing.
    assert store.read_and_claim_step(run_id, 0, step_key, owner="w2", lease_until=lease, now=now) is None
    assert store.run(run_id) == claimed
    # Once it expired, w2 takes the run over; it was running already: no second event.
    later = lease + timedelta(seconds=1)
    taken = store.read_and_claim_step(
        run_id, 0, step_key, owner="w2", lease_until=later + timedelta(seconds=30), now=later
    )
    assert taken is not None and taken.run == _without_texts(claimed)
    assert _outbox_and_run_events(store, run_id)[1].count({"run_id": run_id, "status": "running"}) == 1
    with store.transaction() as tx:
        tx.advance_run(run_id, fence=claimed.fence + 1, now=later, status="completed", lease_owner=None)
    ended = store.run(run_id)
    assert (
        store.read_and_claim_step(
            run_id,
            0,
            step_key,
            owner="w3",
            lease_until=later + timedelta(seconds=60),
            now=later + timedelta(seconds=31),
        )
        is None
    )
    assert store.run(run_id) == ended


def test_a_step_claim_reads_the_history_its_cache_asks_for_as_a_read_apart_would(store: Store) -> None:
    # The messages that come with a claim are those list_messages (the whole thread) or
    # list_message_ends (a cached copy's ends and what follows) read apart, field for field:
    # tool calls and results, meta, keys and timestamps as aware UTC datetimes.
    run_id, step_key = _queued_run(store)
    run = store.run(run_id)
    assert run is not None
    now = run_ledger.utcnow()
    call = ToolCall(id="c1", name="lookup", effect_key=f"{run_id}:0:0", args={"q": "naïve \u2603", "n": [1, 2.5, None]})
    with store.transaction() as tx:
        tx.insert_message(
            thread_id=run.thread_id, run_id=run_id, role="assistant", text="", now=now, tool_calls=(call,)
        )
        result = ToolResult(call_id="c1", name="lookup", content='{"rows": [{"a": 1}]}', kind="json")
        tx.insert_message(thread_id=run.thread_id, run_id=run_id, role="tool", text="", now=now, tool_result=result)
        tx.insert_message(thread_id=run.thread_id, run_id=run_id, role="user", text="more\nlines", now=now,
                          meta={"source": "note"}, key="k-1")  # fmt: skip
    whole = store.list_messages(run.thread_id)
    assert len(whole) == 4
    later = now + timedelta(seconds=1)
    lease = later + timedelta(seconds=30)
    claimed = store.read_and_claim_step(run_id, 0, step_key, owner="w1", lease_until=lease, now=later)
    assert claimed is not None and claimed.history_ends == (-1, 0)
    assert claimed.messages == whole
    assert all(m.created_at.tzinfo is not None and m.created_at.utcoffset() == timedelta(0) for m in claimed.messages)
    # A later step whose cache holds seqs 0..1 asks for their ends and what follows.
    with store.transaction() as tx:
        tx.advance_run(run_id, fence=run.fence + 1, now=later, step=1, lease_owner=None, lease_expires_at=None)
    again = store.read_and_claim_step(run_id, 1, run_ledger.step_key(run_id, 1), owner="w1", lease_until=lease, now=later,
                                      history_ends=(0, 1))  # fmt: skip
    assert again is not None and again.history_ends == (0, 1)
    assert again.messages == store.list_message_ends(run.thread_id, first_seq=0, last_seq=1)
    assert [m.seq for m in again.messages] == [0, 1, 2, 3]


def _claim_step(store: Store, run_id: str, step: int, **history: object) -> ClaimedStep:
    """Claim ``step`` of ``run_id`` (moving the run to it first), reading its history as asked."""
    run = store.run(run_id)
    assert run is not None
    now = run_ledger.utcnow()
    if run.step != step:
        with store.transaction() as tx:
            tx.advance_run(run_id, fence=run.fence, now=now, step=step, lease_owner=None, lease_expires_at=None)
    key = run_ledger.step_key(run_id, step)
    claimed = store.read_and_claim_step(run_id, step, key, owner="w1", lease_until=now, now=now, **history)  # type: ignore[arg-type]
    assert claimed is not None
    return claimed


def test_a_step_claim_does_not_read_again_an_end_whose_row_version_has_not_moved(store: Store) -> None:
    run_id, _key = _queued_run(store)
    run = store.run(run_id)
    assert run is not None
    long_prompt = "a long document " * 4000
    with store.transaction() as tx:
        tx.conn.execute(messages.update().where(messages.c.thread_id == run.thread_id).values(text=long_prompt))
        tx.insert_message(thread_id=run.thread_id, run_id=run_id, role="assistant", text="reply 1",
                          now=run_ledger.utcnow())  # fmt: skip
    whole = _claim_step(store, run_id, 0)
    assert [m.text for m in whole.messages] == [long_prompt, "reply 1"] and whole.unchanged == frozenset()
    assert set(whole.versions) == {0, 1}
    with store.transaction() as tx:
        tx.insert_message(thread_id=run.thread_id, run_id=run_id, role="user", text="more", now=run_ledger.utcnow())
    # The cache holds seqs 0..1 and knows their versions: only the new row is read.
    versions = (whole.versions[0], whole.versions[1])
    again = _claim_step(store, run_id, 1, history_ends=(0, 1), history_versions=versions)
    assert again.unchanged == {0, 1}
    assert [(m.seq, m.text) for m in again.messages] == [(2, "more")] and set(again.versions) == {2}
    # Without the versions, the ends come whole, as a read apart gives them.
    unknown = _claim_step(store, run_id, 2, history_ends=(0, 1))
    assert unknown.unchanged == frozenset()
    assert unknown.messages == store.list_message_ends(run.thread_id, first_seq=0, last_seq=1)
    # A row rewritten in place has a new version: it comes whole, with its new text.
    with store.transaction() as tx:
        tx.conn.execute(
            messages.update().where(messages.c.thread_id == run.thread_id, messages.c.seq == 0).values(text="redacted")
        )
    rewritten = _claim_step(store, run_id, 3, history_ends=(0, 1), history_versions=versions)
    assert rewritten.unchanged == {1}
    assert [(m.seq, m.text) for m in rewritten.messages] == [(0, "redacted"), (2, "more")]
    assert rewritten.versions[0] != versions[0]


def test_a_worker_keeps_a_long_prompt_cached_and_sees_a_rewritten_end(store: Store) -> None:
    # Through the runtime: the step cache's hits come from versions, and a first message rewritten
    # in place between two steps reaches the model.
    seen: list[str] = []
    echo = tool(name="echo", description="x", input=In, effect="read_only", execute=lambda inp, ctx: f"n={inp.n}")

    def first_text(messages: list[Any], _info: Any) -> Any:
        seen.append(next(p.content for p in messages[0].parts if isinstance(p, UserPromptPart)))
        calls_made = sum(isinstance(m, ModelResponse) for m in messages)

        async def stream() -> Any:
            if calls_made < 3:
                yield {0: DeltaToolCall(name="echo", json_args=f'{{"n": {calls_made}}}', tool_call_id=f"c{calls_made}")}
            else:
                yield "done"

        return stream()

    agent = Agent(name="long_prompt", instructions="x", tools=[echo], model=FunctionModel(stream_function=first_text))
    long_prompt = "a long document " * 4000
    runtime, run, queue = _start(store, agent, long_prompt)
    while queue:
        entry = queue.pop(0)
        if entry.task == "threads.step" and entry.args[1] == 2:
            with store.transaction() as tx:
                tx.conn.execute(
                    messages.update()
                    .where(messages.c.thread_id == run.thread_id, messages.c.seq == 0)
                    .values(text="redacted")
                )
        (runtime.run_step if entry.task == "threads.step" else runtime.run_tool)(*entry.args)
    assert seen == [long_prompt, long_prompt, "redacted", "redacted"]
    # Step 1 extends the cache (its ends unchanged), step 2 finds the first end moved and reads
    # the thread again, step 3 extends the cache again.
    assert (runtime.history.misses, runtime.history.hits) == (2, 2)
    assert store.run(run.id).status == "completed"  # type: ignore[union-attr]


def test_two_deliveries_of_a_step_at_once_claim_it_once(store: Store) -> None:
    run_id, step_key = _queued_run(store)
    now = datetime.now(UTC)
    lease = now + timedelta(seconds=30)
    with ThreadPoolExecutor(8) as pool:
        claims = list(
            pool.map(
                lambda owner: store.read_and_claim_step(run_id, 0, step_key, owner=owner, lease_until=lease, now=now),
                [f"w{i}" for i in range(8)],
            )
        )
    assert sum(claim is not None for claim in claims) == 1
    claimed = store.run(run_id)
    assert claimed is not None and claimed.fence == 1
    assert _outbox_and_run_events(store, run_id)[1].count({"run_id": run_id, "status": "running"}) == 1
