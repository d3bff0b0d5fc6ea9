"""Capabilities and async instructions, side by side: plain Pydantic AI and from_pydantic_ai.

One FunctionModel answers both runs and records what it was given: the model settings, the text
of the instructions and system prompts, and the tools offered. What a capability adds (``Caching``'s
setting, instructions, a plain tool) and what an async instruction function returns must reach the
model in both. A capability that does anything else is a ConfigError naming it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.caching import Caching
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, SystemPromptPart, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.profiles import ModelProfile
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset

from threads_celery import ConfigError, Threads, from_pydantic_ai

WAIT_S = 30.0
_names = itertools.count()

ping_tools = FunctionToolset()


@ping_tools.tool_plain
def ping(times: int) -> str:
    """Ping the service."""
    return "pong" * times


@dataclass
class Brief(AbstractCapability[Any]):
    """Adds an instruction and a tool."""

    def get_instructions(self) -> str:
        return "Answer in one line."

    def get_toolset(self) -> FunctionToolset[Any]:
        return ping_tools


@dataclass
class Audited(AbstractCapability[Any]):
    """Runs code around every tool call: nothing a durable step can replay."""

    async def before_tool_execute(self, ctx: Any, **kwargs: Any) -> Any:
        return None


def recording(seen: dict[str, Any]) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        texts = [
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, SystemPromptPart)
        ]
        texts += [m.instructions for m in messages if isinstance(m, ModelRequest) and m.instructions]
        seen["prompt"] = "\n\n".join(texts)
        seen["cache"] = info.model_request_parameters.cache  # the unified setting, resolved by the model
        seen["tools"] = sorted(t.name for t in info.function_tools)
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(answer, profile=ModelProfile(supports_cache=True))


def side_by_side(threads: Threads, build: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    plain_seen: dict[str, Any] = {}
    build(recording(plain_seen), None).run_sync("hello", deps=7)
    durable_seen: dict[str, Any] = {}
    agent = from_pydantic_ai(build(recording(durable_seen), f"pai_cap_{next(_names)}"), deps=make_deps)
    run = threads.wait(threads.start(agent, "hello").run_id, WAIT_S)
    assert run.status == "completed", run.error
    return plain_seen, durable_seen


def make_deps() -> int:
    return 7


def test_caching_carries_its_model_setting(threads: Threads) -> None:
    plain, durable = side_by_side(
        threads, lambda model, name: PydanticAgent(model, name=name, deps_type=int, capabilities=[Caching()])
    )
    assert plain["cache"] is True and durable["cache"] is True


def test_a_capabilitys_instructions_and_tools_reach_the_model(threads: Threads) -> None:
    plain, durable = side_by_side(
        threads,
        lambda model, name: PydanticAgent(
            model, name=name, deps_type=int, instructions="You help.", capabilities=[Brief()]
        ),
    )
    assert plain["tools"] == durable["tools"] == ["ping"]
    assert "Answer in one line." in plain["prompt"] and "Answer in one line." in durable["prompt"]
    assert "You help." in durable["prompt"]


def test_an_async_instruction_function_is_awaited_each_turn(threads: Threads) -> None:
    def build(model: FunctionModel, name: str | None) -> PydanticAgent[int, str]:
        agent = PydanticAgent(model, name=name, deps_type=int)

        @agent.instructions
        async def customer(ctx: RunContext[int]) -> str:
            return f"The customer's id is {ctx.deps}."

        return agent

    plain, durable = side_by_side(threads, build)
    assert plain["prompt"] == durable["prompt"] == "The customer's id is 7."


def test_a_capability_that_hooks_into_tool_calls_is_a_config_error_naming_it() -> None:
    source = PydanticAgent(
        FunctionModel(lambda m, i: ModelResponse(parts=[])), name="audited", capabilities=[Audited()]
    )
    with pytest.raises(ConfigError, match=r"capability Audited uses before_tool_execute"):
        from_pydantic_ai(source)


def test_a_tools_prepare_function_shapes_it_on_each_turn(threads: Threads) -> None:
    def build(model: FunctionModel, name: str | None) -> PydanticAgent[int, str]:
        agent = PydanticAgent(model, name=name, deps_type=int)

        async def only_for_big_customers(ctx: RunContext[int], tool_def: ToolDefinition) -> ToolDefinition | None:
            if ctx.deps < 5:
                return None
            return replace(tool_def, description=f"{tool_def.description} (customer {ctx.deps})")

        @agent.tool(prepare=only_for_big_customers)
        def discount(ctx: RunContext[int], percent: int) -> str:
            """Give a discount."""
            return f"{percent}% off"

        @agent.tool_plain
        def hello() -> str:
            """Say hello."""
            return "hi"

        return agent

    def model(seen: dict[str, Any]) -> FunctionModel:
        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen["tools"] = sorted((t.name, t.description) for t in info.function_tools)
            return ModelResponse(parts=[TextPart("done")])

        return FunctionModel(answer)

    plain_seen: dict[str, Any] = {}
    build(model(plain_seen), None).run_sync("go", deps=7)
    durable_seen: dict[str, Any] = {}
    agent = from_pydantic_ai(build(model(durable_seen), f"pai_prepare_{next(_names)}"), deps=make_deps)
    assert threads.wait(threads.start(agent, "go").run_id, WAIT_S).status == "completed"
    assert (
        durable_seen["tools"]
        == plain_seen["tools"]
        == [("discount", "Give a discount. (customer 7)"), ("hello", "Say hello.")]
    )

    small_seen: dict[str, Any] = {}
    small = from_pydantic_ai(build(model(small_seen), f"pai_prepare_{next(_names)}"), deps=make_small_deps)
    assert threads.wait(threads.start(small, "go").run_id, WAIT_S).status == "completed"
    assert small_seen["tools"] == [("hello", "Say hello.")]  # left out this turn


def make_small_deps() -> int:
    return 2


def test_a_prepare_function_that_raises_ends_the_run_naming_it_without_retrying(threads: Threads) -> None:
    asked: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        return ModelResponse(parts=[TextPart("done")])

    source = PydanticAgent(FunctionModel(answer), name=f"pai_broken_prepare_{next(_names)}")

    def broken(ctx: RunContext[None], tool_def: ToolDefinition) -> ToolDefinition | None:
        raise KeyError("no such plan")

    @source.tool(prepare=broken)
    def upgrade(ctx: RunContext[None], plan: str) -> str:
        """Upgrade the plan."""
        return plan

    run = threads.wait(threads.start(from_pydantic_ai(source), "go").run_id, WAIT_S)
    assert (
        run.status == "error"
        and "prepare function of tool 'upgrade'" in (run.error or "")
        and "KeyError" in (run.error or "")
    )
    assert asked == []  # the model was never asked, and the turn was not retried as a provider failure
