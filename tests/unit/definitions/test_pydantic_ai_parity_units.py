"""The same Pydantic AI agent plainly and durably: what its model saw and what its code ran.

Each case builds one agent twice from the same recipe, each with its own log: once run with
``agent.run_sync`` and once made durable with ``from_pydantic_ai`` and run on the embedded runtime
(SQLite and the in-process Celery worker). The model is a ``FunctionModel`` whose function records
what it is given (:func:`tests.support.pai_parity.seen`) and which tools it is offered; tools,
``prepare`` functions, instructions and output validators record that they ran, with the
``RunContext.run_step`` they were given. Both logs, and how the runs ended, must be equal:

- ``ctx.run_step`` counts the run's model requests (1 for the first) in prepare functions,
  instructions, tools and output validators, so a prepare function keyed on it hides its tool from
  the second request on;
- each ``end_strategy`` runs the function tools the model calls beside an output call as Pydantic
  AI does (``early``: not when an output is valid; ``graceful`` and ``exhaustive``: always, and a
  function tool's retry keeps the output from ending the run);
- an output validator runs once per output the model sends, also past the output retries.

A real worker process runs the same agents in tests/integration/test_pydantic_ai_parity_more.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition

from tests.support.pai_parity import seen
from threads_celery import Permissions, Threads, from_pydantic_ai

WAIT_S = 30.0
_names = itertools.count()


@dataclass
class Log:
    """What one run's model saw (per request) and what the agent's code ran, in order."""

    seen: list[Any] = field(default_factory=list)
    offered: list[list[str]] = field(default_factory=list)
    ran: list[Any] = field(default_factory=list)


Recipe = Callable[[Log], PydanticAgent[Any, Any]]


def side_by_side(threads: Threads, recipe: Recipe, prompt: str = "go") -> tuple[tuple[Any, Log], tuple[Any, Log]]:
    """((how the plain run ended, its log), (how the durable run ended, its log)); an ending is
    ``("output", value)`` or ``("error", text)``."""
    plain_log, durable_log = Log(), Log()
    try:
        plain: Any = ("output", recipe(plain_log).run_sync(prompt).output)
    except Exception as exc:  # noqa: BLE001 - Pydantic AI's own way of ending a run
        plain = ("error", str(exc))
    agent = from_pydantic_ai(
        recipe(durable_log), name=f"parity_more_{next(_names)}", permissions=Permissions.allow_all()
    )
    run = threads.wait(threads.start(agent, prompt).run_id, WAIT_S)
    if run.status == "completed":
        durable: Any = ("output", agent.parse_output(run.output))
    else:
        durable = ("error", run.error or run.status)
    return (plain, plain_log), (durable, durable_log)


def scripted(log: Log, replies: Callable[[int], list[Any]]) -> FunctionModel:
    """A model that records what it is given, then answers request n (from 1) with ``replies(n)``."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        log.seen.append(seen(messages))
        log.offered.append(sorted(t.name for t in info.function_tools))
        return ModelResponse(parts=replies(len(log.seen)))

    return FunctionModel(answer)


class Answer(BaseModel):
    """The agent's answer."""

    text: str


# -- ctx.run_step ------------------------------------------------------------------------------


def run_step_recipe(log: Log) -> PydanticAgent[Any, Any]:
    def replies(n: int) -> list[Any]:
        return [ToolCallPart("lookup", {"key": "a"})] if n == 1 else [TextPart("done")]

    agent = PydanticAgent(scripted(log, replies))

    @agent.instructions
    def say_step(ctx: RunContext[None]) -> str:
        log.ran.append(("instructions", ctx.run_step))
        return f"This is request {ctx.run_step}."

    async def only_first(ctx: RunContext[None], definition: ToolDefinition) -> ToolDefinition | None:
        log.ran.append(("prepare", ctx.run_step))
        return definition if ctx.run_step < 2 else None

    @agent.tool(prepare=only_first)
    def lookup(ctx: RunContext[None], key: str) -> str:
        log.ran.append(("lookup", ctx.run_step))
        return f"{key}=1"

    return agent


def test_run_step_counts_model_requests_in_prepare_instructions_and_tools(threads: Threads) -> None:
    (plain, plain_log), (durable, durable_log) = side_by_side(threads, run_step_recipe)
    assert durable == plain == ("output", "done")
    assert plain_log.offered == [["lookup"], []]  # the prepare function hid it from request 2
    assert durable_log.offered == plain_log.offered
    assert durable_log.ran == plain_log.ran
    assert ("lookup", 1) in plain_log.ran and ("instructions", 2) in plain_log.ran
    assert durable_log.seen == plain_log.seen


# -- end_strategy ------------------------------------------------------------------------------


def strategy_recipe(strategy: str, order: str, *, tool_retries_once: bool = False) -> Recipe:
    def recipe(log: Log) -> PydanticAgent[Any, Any]:
        def replies(n: int) -> list[Any]:
            if n > 1:
                return [ToolCallPart("final_result", {"text": "second"})]
            note = ToolCallPart("note", {"text": "beside"})
            output = ToolCallPart("final_result", {"text": "first"})
            return [note, output] if order == "function first" else [output, note]

        agent = PydanticAgent(scripted(log, replies), output_type=Answer, end_strategy=strategy)  # type: ignore[arg-type]

        @agent.tool
        def note(ctx: RunContext[None], text: str) -> str:
            log.ran.append(("note", text, ctx.run_step))
            if tool_retries_once and ctx.retry == 0:
                raise ModelRetry("write it again")
            return "noted"

        @agent.output_validator
        def check(ctx: RunContext[None], output: Answer) -> Answer:
            log.ran.append(("validator", output.text, ctx.run_step))
            return output

        return agent

    return recipe


STRATEGIES = [
    (strategy, order)
    for strategy in ("early", "graceful", "exhaustive")
    for order in ("function first", "output first")
]


@pytest.mark.parametrize(("strategy", "order"), STRATEGIES, ids=[f"{s}, {o}" for s, o in STRATEGIES])
def test_each_end_strategy_runs_the_tools_beside_the_output_as_pydantic_ai_does(
    threads: Threads, strategy: str, order: str
) -> None:
    (plain, plain_log), (durable, durable_log) = side_by_side(threads, strategy_recipe(strategy, order))
    assert durable == plain == ("output", Answer(text="first"))
    ran_note = [r for r in plain_log.ran if r[0] == "note"]
    assert ran_note == ([] if strategy == "early" else [("note", "beside", 1)])
    # The same calls ran; durably one after the other, the function call before the output's
    # validator (Pydantic AI runs an output emitted first before the calls after it).
    assert sorted(durable_log.ran) == sorted(plain_log.ran)
    assert durable_log.seen == plain_log.seen


@pytest.mark.parametrize("strategy", ["graceful", "exhaustive"])
def test_a_function_tool_s_retry_keeps_a_valid_output_from_ending_the_run(threads: Threads, strategy: str) -> None:
    recipe = strategy_recipe(strategy, "function first", tool_retries_once=True)
    (plain, plain_log), (durable, durable_log) = side_by_side(threads, recipe)
    assert durable == plain == ("output", Answer(text="second"))
    assert (
        durable_log.ran
        == plain_log.ran
        == [
            ("note", "beside", 1),
            ("validator", "first", 1),
            ("validator", "second", 2),
        ]
    )
    assert len(plain_log.seen) == 2
    assert durable_log.seen == plain_log.seen  # the retry, and the output set aside for it


def test_an_unknown_end_strategy_is_a_config_error() -> None:
    from threads_celery import ConfigError

    agent = PydanticAgent(FunctionModel(lambda m, i: ModelResponse(parts=[])), output_type=Answer, name="odd_end")
    agent.end_strategy = "sometimes"  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="end_strategy='sometimes'"):
        from_pydantic_ai(agent)


# -- output validators -------------------------------------------------------------------------


class Query(BaseModel):
    """A SQL query."""

    sql: str


def validated_recipe(always_invalid: bool, retries: int = 1) -> Recipe:
    def recipe(log: Log) -> PydanticAgent[Any, Any]:
        def replies(n: int) -> list[Any]:
            sql = "SELECT * FROM nosuch" if always_invalid or n == 1 else "SELECT * FROM users"
            return [ToolCallPart("final_result", {"sql": sql})]

        agent = PydanticAgent(scripted(log, replies), output_type=Query, retries={"output": retries})

        @agent.output_validator
        async def explain(ctx: RunContext[None], output: Query) -> Query:
            table = output.sql.rsplit(" ", 1)[-1]
            log.ran.append(("explain", table, ctx.run_step))
            if table == "nosuch":
                raise ModelRetry(f"no such table: {table}")
            return output

        return agent

    return recipe


def test_an_output_validator_runs_once_for_each_output(threads: Threads) -> None:
    (plain, plain_log), (durable, durable_log) = side_by_side(threads, validated_recipe(always_invalid=False))
    assert durable == plain == ("output", Query(sql="SELECT * FROM users"))
    assert durable_log.ran == plain_log.ran == [("explain", "nosuch", 1), ("explain", "users", 2)]
    assert durable_log.seen == plain_log.seen


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_past_the_output_retries_the_validator_ran_as_often_as_plainly(threads: Threads, retries: int) -> None:
    (plain, plain_log), (durable, durable_log) = side_by_side(threads, validated_recipe(True, retries))
    assert plain == ("error", f"Exceeded maximum output retries ({retries})")
    assert durable == plain
    assert len(plain_log.ran) == retries + 1
    assert durable_log.ran == plain_log.ran
    assert durable_log.seen == plain_log.seen


def test_a_later_run_of_the_thread_sees_the_output_call_as_processed(threads: Threads) -> None:
    """The output call that ended a run is shown to the next run's model as Pydantic AI keeps it."""
    log = Log()
    agent = from_pydantic_ai(validated_recipe(always_invalid=False)(log), name=f"parity_more_{next(_names)}")
    first = threads.wait(threads.start(agent, "first").run_id, WAIT_S)
    assert first.status == "completed", first.error
    second = threads.wait(threads.start(agent, "second", thread_id=first.thread_id).run_id, WAIT_S)
    assert second.status == "completed", second.error
    returns = [p for p in log.seen[-1] if p[0] == "return"]
    assert returns[-1] == ("return", "final_result", "Final result processed.", "success")
