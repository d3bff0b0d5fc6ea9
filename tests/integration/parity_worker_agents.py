"""Pydantic AI agents for the worker-side parity tests (tests/integration/test_pydantic_ai_parity_more.py).

Each recipe builds the agent around a log; the worker's copy (``durable_*`` below, loaded by the
worker through ``THREADS_AGENTS``) logs to files in ``PARITY_LOG_DIR``, one JSON line per entry,
so the test process can read what the worker's model saw and what its code ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition

from tests.support.pai_parity import seen
from threads_celery import Permissions, from_pydantic_ai


class Entries(list[Any]):
    """A list that also appends each entry, as a JSON line, to a file (when it has one)."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self.path = path

    def append(self, entry: Any) -> None:
        super().append(entry)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")


class Log:
    """What a run's model saw and was offered, and what the agent's code ran."""

    def __init__(self, folder: Path | None = None, name: str = "") -> None:
        self.seen = Entries(folder / f"{name}.seen" if folder else None)
        self.offered = Entries(folder / f"{name}.offered" if folder else None)
        self.ran = Entries(folder / f"{name}.ran" if folder else None)


def read(folder: Path, name: str, what: str) -> list[Any]:
    """The entries a worker's log wrote (round-tripped through JSON, as a plain log can be)."""
    path = folder / f"{name}.{what}"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def scripted(log: Log, replies: Any) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        log.seen.append(seen(messages))
        log.offered.append(sorted(t.name for t in info.function_tools))
        # Request n of the run, read from the messages: a worker's pool processes share no memory.
        return ModelResponse(parts=replies(1 + sum(isinstance(m, ModelResponse) for m in messages)))

    return FunctionModel(answer)


def run_step_agent(log: Log) -> Agent[None, str]:
    """A tool whose prepare function offers it on the run's first model request only."""

    def replies(n: int) -> list[Any]:
        return [ToolCallPart("lookup", {"key": "a"})] if n == 1 else [TextPart("done")]

    agent = Agent(scripted(log, replies), name="parity_run_step")

    @agent.instructions
    def say_step(ctx: RunContext[None]) -> str:
        log.ran.append(["instructions", ctx.run_step])
        return f"This is request {ctx.run_step}."

    async def only_first(ctx: RunContext[None], definition: ToolDefinition) -> ToolDefinition | None:
        log.ran.append(["prepare", ctx.run_step])
        return definition if ctx.run_step < 2 else None

    @agent.tool(prepare=only_first)
    def lookup(ctx: RunContext[None], key: str) -> str:
        log.ran.append(["lookup", ctx.run_step])
        return f"{key}=1"

    return agent


class Query(BaseModel):
    """A SQL query."""

    sql: str


def sql_agent(log: Log, always_invalid: bool = False) -> Agent[None, Query]:
    """An output validator that EXPLAINs the query, refusing one on a table that does not exist."""

    def replies(n: int) -> list[Any]:
        sql = "SELECT * FROM nosuch" if always_invalid or n == 1 else "SELECT * FROM users"
        return [ToolCallPart("final_result", {"sql": sql})]

    agent = Agent(
        scripted(log, replies), output_type=Query, name="parity_sql_invalid" if always_invalid else "parity_sql"
    )

    @agent.output_validator
    async def explain(ctx: RunContext[None], output: Query) -> Query:
        table = output.sql.rsplit(" ", 1)[-1]
        log.ran.append(["explain", table, ctx.run_step])
        if table == "nosuch":
            raise ModelRetry(f"no such table: {table}")
        return output

    return agent


def strategy_agent(log: Log) -> Agent[None, Query]:
    """A function tool called beside the output call, under the default end strategy (graceful)."""

    def replies(n: int) -> list[Any]:
        return [ToolCallPart("note", {"text": "beside"}), ToolCallPart("final_result", {"sql": "SELECT 1"})]

    agent = Agent(scripted(log, replies), output_type=Query, name="parity_strategy")

    @agent.tool
    def note(ctx: RunContext[None], text: str) -> str:
        log.ran.append(["note", text, ctx.run_step])
        return "noted"

    return agent


def delegating_agent(log: Log) -> Agent[None, str]:
    """flight_booking's shape: a tool reads ctx.usage and runs a delegate agent (two requests)
    with usage=ctx.usage; the delegate's requests are the run's."""
    delegate = Agent(
        scripted(Log(), lambda n: [ToolCallPart("fetch", {"q": "x"})] if n == 1 else [TextPart("LH 123")]),
        name="parity_delegate",
    )

    @delegate.tool_plain
    def fetch(q: str) -> str:
        return f"flights for {q}"

    def replies(n: int) -> list[Any]:
        return [ToolCallPart("search", {"route": "LIS-BER"})] if n == 1 else [TextPart("booked")]

    agent = Agent(scripted(log, replies), name="parity_delegating")

    @agent.tool
    async def search(ctx: RunContext[None], route: str) -> str:
        log.ran.append(["search", route, ctx.usage.requests, ctx.usage.tool_calls])
        found = await delegate.run(f"search {route}", usage=ctx.usage)
        return found.output

    return agent


_folder = Path(os.environ["PARITY_LOG_DIR"]) if os.environ.get("PARITY_LOG_DIR") else None
ALLOWED = Permissions.allow_all()
durable_run_step = from_pydantic_ai(run_step_agent(Log(_folder, "run_step")), permissions=ALLOWED)
durable_sql = from_pydantic_ai(sql_agent(Log(_folder, "sql")), permissions=ALLOWED)
durable_sql_invalid = from_pydantic_ai(sql_agent(Log(_folder, "sql_invalid"), always_invalid=True), permissions=ALLOWED)
durable_strategy = from_pydantic_ai(strategy_agent(Log(_folder, "strategy")), permissions=ALLOWED)
durable_delegating = from_pydantic_ai(delegating_agent(Log(_folder, "delegating")), permissions=ALLOWED)
