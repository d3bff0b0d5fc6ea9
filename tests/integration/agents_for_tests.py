"""Agents the integration tests' worker subprocess loads (``THREADS_AGENTS=tests.integration.agents_for_tests``).

The test process imports this module too, to register the same agents with its client: both
sides compute the same config hash. Scripts are :class:`ScriptedModel` scripts, whose position is
read from the conversation, so any worker process plays them the same way.

Tools cannot share memory with the test, so the ones a test must hold still talk through files:
``wait_for_file`` creates ``<path>.entered`` when it starts and returns once ``<path>`` exists.
The file path travels in the user message (``"gate <path>"``), which a callable script entry reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from threads_celery import Agent, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say

GATE_TIMEOUT_S = 60.0


class AddIn(BaseModel):
    a: int
    b: int


class CountIn(BaseModel):
    n: int = Field(description="The number to count")


class GateIn(BaseModel):
    path: str = Field(description="The file whose existence opens the gate")


def _add(inp: AddIn, ctx: Any) -> dict[str, int]:
    return {"sum": inp.a + inp.b}


def _count(inp: CountIn, ctx: Any) -> str:
    # Reports the key it ran under, so the test can check it against the ledger.
    return f"counted {inp.n} as {ctx.effect_key}"


def _wait_for_file(inp: GateIn, ctx: Any) -> str:
    gate = Path(inp.path)
    Path(f"{gate}.entered").touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate.name} was never opened")
        time.sleep(0.02)
    return f"opened {gate.name}"


add = tool(name="add", description="Add two integers.", input=AddIn, effect="read_only", execute=_add)
count = tool(name="count", description="Count a number.", input=CountIn, effect="unguarded", execute=_count)
wait_for_file = tool(
    name="wait_for_file",
    description="Wait until a file exists.",
    input=GateIn,
    effect="read_only",
    execute=_wait_for_file,
)


def _gate_call(messages: list[Any]) -> Any:
    """Call ``wait_for_file`` with the path from the last user message (``"gate <path>"``)."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    _, _, path = str(part.content).partition(" ")
                    return call("wait_for_file", path=path)
    raise ValueError("no user message in the conversation")


one_step = Agent(
    name="it_one_step",
    instructions="Answer at once.",
    model=ScriptedModel([say("one step done")]),
)

three_steps = Agent(
    name="it_three_steps",
    instructions="Add twice, then answer.",
    model=ScriptedModel([call("add", a=1, b=2), call("add", a=3, b=4), say("3 and 7")]),
    tools=[add],
)

twenty_steps = Agent(
    name="it_twenty_steps",
    instructions="Count to eighteen, one call per turn.",
    model=ScriptedModel([call("count", n=i) for i in range(19)] + [say("counted to 18")]),
    tools=[count],
    # count is unguarded: its claim is committed before it runs. Nobody approves in these tests.
    permissions=Permissions.allow_all(),
)

gated = Agent(
    name="it_gated",
    instructions="Wait for the gate, then answer.",
    model=ScriptedModel([_gate_call, say("through the gate")]),
    tools=[wait_for_file],
)

# count is unguarded and the permissions are the default ones: its call asks a person first.
asks_first = Agent(
    name="it_asks_first",
    instructions="Count once, then answer.",
    model=ScriptedModel([call("count", n=1), say("counted once")]),
    tools=[count],
)

ALL_AGENTS = (one_step, three_steps, twenty_steps, gated, asks_first)
