"""Pydantic AI agents as their authors wrote them, and the durable agents the adapter makes.

Importable by a worker (``THREADS_AGENTS=tests.support.pydantic_ai_agents``): the dependency
factories are module-level functions, so a worker builds the dependencies itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from threads_celery import from_pydantic_ai


class Forecast(BaseModel):
    """What the weather agent answers with."""

    city: str
    temperature: int


@dataclass
class WeatherDeps:
    """The weather tools' dependencies: an offset standing in for a client or a pool."""

    offset: int
    unit: str


def make_weather_deps() -> WeatherDeps:
    """Built in the worker, once per worker thread."""
    return WeatherDeps(offset=int(os.environ.get("WEATHER_OFFSET", "10")), unit="C")


def broken_deps() -> WeatherDeps:
    """A factory whose dependency is unavailable in the worker."""
    raise ConnectionError("the weather service's credentials are not set in this worker")


# -- the weather agent, driven by Pydantic AI's TestModel ------------------------------------------

weather = Agent(
    TestModel(),
    name="pai_weather",
    instructions="Answer with a forecast.",
    output_type=Forecast,
    deps_type=WeatherDeps,
    model_settings={"temperature": 0.0},
)


@weather.tool
def temperature(ctx: RunContext[WeatherDeps], city: str) -> int:
    """The current temperature in a city."""
    return 11 + ctx.deps.offset


@weather.tool_plain
def book_trip(city: str) -> str:
    """Book a trip to a city."""
    return f"booked a trip to {city}"


durable_weather = from_pydantic_ai(weather, effects={"temperature": "read_only"}, deps=make_weather_deps)

broken_weather = from_pydantic_ai(
    weather, name="pai_weather_broken", effects={"temperature": "read_only"}, deps=broken_deps
)


# -- an agent driven by FunctionModel that reports what reached the model --------------------------


def report_what_the_model_saw(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First turn: call ``lookup``; second turn: describe the request the model received."""
    returned = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("lookup", {"key": "alpha"})])
    system = [p.content for m in messages for p in getattr(m, "parts", ()) if isinstance(p, SystemPromptPart)]
    seen = {
        "system": system,
        "instructions": info.instructions,
        "settings": dict(info.model_settings or {}),
        "tools": sorted(t.name for t in info.function_tools),
        "lookup_schema": next(t.parameters_json_schema for t in info.function_tools if t.name == "lookup"),
        "allow_text_output": info.allow_text_output,
        "returned": [str(p.content) for p in returned],
    }
    return ModelResponse(parts=[TextPart(json.dumps(seen))])


reporter = Agent(
    FunctionModel(report_what_the_model_saw),
    name="pai_reporter",
    system_prompt="You are a careful assistant.",
    instructions="Use the lookup tool.",
    deps_type=WeatherDeps,
    model_settings={"temperature": 0.25, "max_tokens": 321},
)


@reporter.instructions
def unit_instructions(ctx: RunContext[WeatherDeps]) -> str:
    """A dynamic instruction built from the worker's dependencies."""
    return f"Report temperatures in {ctx.deps.unit}."


@reporter.tool
def lookup(ctx: RunContext[WeatherDeps], key: str, limit: int = 3) -> str:
    """Look a key up.

    Args:
        key: What to look up.
        limit: How many results at most.
    """
    return f"{key}:{limit}:{ctx.deps.offset}:{ctx.tool_call_id}"


durable_reporter = from_pydantic_ai(reporter, effects={"lookup": "read_only"}, deps=make_weather_deps)


# -- structured output that the model gets wrong once ----------------------------------------------


def wrong_then_right(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First an output that fails the output type, then (having seen why) a valid one."""
    [output_tool] = info.output_tools
    retried = any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", ()))
    if not retried:
        return ModelResponse(parts=[ToolCallPart(output_tool.name, {"city": "Rome", "temperature": "warm"})])
    return ModelResponse(parts=[ToolCallPart(output_tool.name, {"city": "Rome", "temperature": 24})])


fussy = Agent(FunctionModel(wrong_then_right), name="pai_fussy", output_type=Forecast)
durable_fussy = from_pydantic_ai(fussy)


# -- a tool that asks the model to retry -----------------------------------------------------------


def call_picky_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("picky", {"word": "nope"})])
    return ModelResponse(parts=[TextPart(f"the tool said: {returned[0].content}")])


picky_agent = Agent(FunctionModel(call_picky_then_answer), name="pai_picky")


@picky_agent.tool_plain
def picky(word: str) -> str:
    """Accept only the word 'please'."""
    if word != "please":
        raise ModelRetry("say please")
    return "thanks"


durable_picky = from_pydantic_ai(picky_agent, effects={"picky": "read_only"})


def make_nothing() -> Any:
    """A factory for agents without dependencies (used to test factory references)."""
    return None
