"""Shared checks of the history cache, run on SQLite (unit) and PostgreSQL (integration).

Two workers (two :class:`~threads_celery.runtime.machine.Runtime` objects, each with its own engine and
its own cache, as two processes would have) drive one run step by step, taking turns, while a
third writer appends messages to the thread between steps. A recording model compares the
history it is given at every step with a full read of the thread in a fresh transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from threads_celery import Agent, tool
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry
from threads_celery.runtime.machine import Runtime
from threads_celery.runtime.models import to_model_messages
from threads_celery.settings import Settings
from threads_celery.store import Store
from threads_celery.transitions import runs as run_ledger

INSTRUCTIONS = "Call echo each turn."


class EchoIn(BaseModel):
    n: int


def comparable(messages: list[ModelMessage]) -> list[Any]:
    """Model messages as plain data without the timestamps a conversion stamps."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "timestamp"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))


class RecordingModel:
    """Replies ``echo(n=turn)`` for ``turns`` turns, then text; records what each turn was given."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.seen: list[list[ModelMessage]] = []
        self.model = FunctionModel(stream_function=self._stream, model_name="recording")

    async def _stream(
        self, messages: list[ModelMessage], _info: AgentInfo
    ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        self.seen.append(list(messages))
        turn = len(self.seen)
        if turn > self.turns:
            yield "done"
        else:
            yield {0: DeltaToolCall(name="echo", json_args=f'{{"n": {turn}}}', tool_call_id=f"c{turn}")}


def drive_with_two_workers(
    open_store: Callable[[], Store], *, turns: int = 6, inject_every: int = 2
) -> tuple[RecordingModel, list[list[Any]], list[Runtime]]:
    """Run one agent's run on two alternating workers with a third writer; see the module doc.

    Returns the model, the expected history (a full read) at each step, and the two runtimes.
    """
    recorder = RecordingModel(turns)
    echo = tool(name="echo", description="Echo n.", input=EchoIn, effect="read_only", execute=lambda i, _c: f"n={i.n}")
    agent = Agent(name="history-check", instructions=INSTRUCTIONS, tools=[echo], model=recorder.model, max_steps=100)
    stores = [open_store(), open_store(), open_store()]
    registry = AgentRegistry()
    registry.add(agent)
    queue: list[OutboxEntry] = []
    workers = [
        Runtime(stores[i], registry, publish=queue.extend, settings=Settings(), worker_id=f"w{i}") for i in range(2)
    ]
    writer = stores[2]
    with writer.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), run_ledger.utcnow())
        run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message="start", now=run_ledger.utcnow()
        )
    queue.extend(entries)
    expected: list[list[Any]] = []
    step = 0
    while queue:
        entry = queue.pop(0)
        if entry.task == "threads.step":
            if step and step % inject_every == 0:
                # Someone else appends to the thread between two steps (a note, a delivered result).
                with writer.transaction() as tx:
                    tx.insert_message(
                        thread_id=run.thread_id, run_id=None, role="user", text=f"note {step}", now=run_ledger.utcnow()
                    )
            with writer.read() as tx:
                expected.append(comparable(to_model_messages(INSTRUCTIONS, tx.list_messages(run.thread_id))))
            workers[step % 2].run_step(*entry.args)
            step += 1
        else:
            workers[step % 2].run_tool(*entry.args)
    final = workers[0].store
    with final.read() as tx:
        finished = tx.get_run(run.id)
    assert finished is not None and finished.status == "completed", finished
    for store in stores:
        if store not in (w.store for w in workers):
            store.dispose()
    return recorder, expected, workers
