"""A run started on a new thread is one statement on PostgreSQL: what the transaction wrote, or nothing.

``Threads.start`` on a new thread (no thread id, run id or env given) writes the thread, the run,
its event, the user's message and its event, and the first step's outbox row with
``START_RUN_PG``. The same start with that path turned off takes the transaction of
``submit_run`` and ``activate``. Both must leave the same rows (ids and times aside), the same
events in the same order, the same outbox row on the agent's recorded queue, and a run that a
worker then drives to the same end. An agent no one registered writes nothing at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from threads_celery import Agent, Threads, UnknownAgent
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry
from threads_celery.runtime.machine import Runtime
from threads_celery.store import Store
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import events, messages, outbox, runs, threads
from threads_celery.testing import ScriptedModel, say
from threads_celery.transitions import runs as run_ledger

pytestmark = pytest.mark.integration


@pytest.fixture
def client(pg_url: str) -> Iterator[Threads]:
    with Threads(database_url=pg_url, broker_url="memory://") as client:
        upgrade(client.store.engine)
        yield client


class Recorder:
    """The client's publisher, keeping what it is given."""

    def __init__(self, into: list[OutboxEntry]) -> None:
        self.into = into

    def ensure_reachable(self) -> None:
        return None

    def __call__(self, entries: list[OutboxEntry]) -> None:
        self.into.extend(entries)

    def close(self) -> None:  # the client closes its publisher, whichever fixture is torn down first
        return None


def _agent(queue: str | None) -> Agent:
    return Agent(name="greeter", instructions="x", model=ScriptedModel([say("hello")]), queue=queue)


def _ledger(store: Store, run_id: str, thread_id: str) -> dict[str, Any]:
    """The run's rows, with its ids and times replaced by placeholders."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(run_id, "RUN").replace(thread_id, "THREAD")
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    times = {"created_at", "updated_at", "due_at", "started_at", "finished_at"}
    with store.engine.connect() as conn:

        def rows(query: Any) -> list[dict[str, Any]]:
            return [{k: clean(v) for k, v in row._mapping.items()} for row in conn.execute(query)]

        found = {
            "threads": rows(select(threads).where(threads.c.id == thread_id)),
            "runs": rows(select(runs).where(runs.c.id == run_id)),
            "messages": rows(
                select(
                    messages.c.seq,
                    messages.c.role,
                    messages.c.text,
                    messages.c.parts,
                    messages.c.meta,
                    messages.c.key,
                    messages.c.run_id,
                ).where(messages.c.thread_id == thread_id)
            ),
            "events": rows(
                select(events.c.seq, events.c.type, events.c.payload, events.c.run_id)
                .where(events.c.thread_id == thread_id)
                .order_by(events.c.seq)
            ),
            "outbox": rows(select(outbox).where(outbox.c.key.contains(run_id))),
        }
    for table in ("threads", "runs", "outbox"):
        for row in found[table]:
            for name in times:
                row.pop(name, None)
    return found


@pytest.mark.parametrize("queue", [None, "bulk"])
def test_both_starts_write_the_same_ledger(client: Threads, monkeypatch: pytest.MonkeyPatch, queue: str | None) -> None:
    agent = _agent(queue)
    client.register(agent)
    published: list[OutboxEntry] = []
    monkeypatch.setattr(client, "publisher", Recorder(published))
    assert client.store.starts_in_one_statement
    one = client.start("greeter", 'hi thère ☃ "quoted"', tenant="acme")
    monkeypatch.setattr(type(client.store), "starts_in_one_statement", property(lambda self: False))
    many = client.start("greeter", 'hi thère ☃ "quoted"', tenant="acme")
    by_one = _ledger(client.store, one.run_id, one.thread_id)
    by_many = _ledger(client.store, many.run_id, many.thread_id)
    assert by_one == by_many
    assert by_one["threads"][0]["tenant"] == "acme" and by_one["threads"][0]["active_run_id"] == "RUN"
    assert [e["type"] for e in by_one["events"]] == ["run", "message"]
    assert by_one["outbox"][0]["queue"] == queue
    assert [(e.key, e.queue) for e in published] == [
        (run_ledger.step_key(one.run_id, 0), queue),
        (run_ledger.step_key(many.run_id, 0), queue),
    ]
    assert (one.status, many.status) == ("queued", "queued")

    # A worker drives the run started in one statement to its end, as the other.
    registry = AgentRegistry()
    registry.add(agent)
    runtime = Runtime(client.store, registry, publish=published.extend)
    while published:
        entry = published.pop(0)
        (runtime.run_step if entry.task == run_ledger.STEP_TASK else runtime.run_tool)(*entry.args)
    assert client.get_run(one.run_id).output == client.get_run(many.run_id).output == "hello"


def test_an_agent_no_one_registered_writes_nothing(client: Threads) -> None:
    with pytest.raises(UnknownAgent):
        client.start("nobody", "hi")
    with client.store.engine.connect() as conn:
        assert conn.execute(select(threads)).first() is None
        assert conn.execute(select(runs)).first() is None
        assert conn.execute(select(outbox)).first() is None
