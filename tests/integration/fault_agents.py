"""Agents whose tools, hooks and dependency factories raise what no tool should, for a real worker.

Every tool counts its calls in a file under ``$TOOL_FAULTS_DIR`` (one line per call), so a test can
tell a call that ran once from one that ran again on every lease. Each agent calls its tool once,
then answers ``after <tool>``: a run that completes with that answer has seen its tool's failure
as a tool error and gone on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent

from threads_celery import Agent, Permissions, from_pydantic_ai, tool
from threads_celery.testing import ScriptedModel, call, say


class NeedsArguments(BaseException):
    """Needs two constructor arguments: unpickling it (from its one-element args) raises TypeError."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


class Hostile(BaseException):
    """Every way of looking at it raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")

    def __reduce__(self) -> Any:
        raise RuntimeError("no pickling for you")


class NoInput(BaseModel):
    pass


def _count(name: str) -> None:
    with (Path(os.environ["TOOL_FAULTS_DIR"]) / f"{name}.calls").open("a") as calls:
        calls.write("called\n")


def _raiser(name: str, exc: BaseException) -> Any:
    def execute(inp: NoInput, ctx: Any) -> str:
        _count(name)
        raise exc

    return execute


def _async_raiser(name: str, exc: BaseException) -> Any:
    async def execute(inp: NoInput, ctx: Any) -> str:
        _count(name)
        raise exc

    return execute


FAULTS: dict[str, BaseException] = {
    "needs_arguments": NeedsArguments(7, "the constructor wants two"),
    "system_exit": SystemExit(3),
    "keyboard_interrupt": KeyboardInterrupt(),
    "hostile": Hostile(),
    "plain_base": BaseException("plain"),
}
# The effect decides a crash's recovery, not a raised exception's: each is a tool error alike.
EFFECTS = {
    "needs_arguments": "unguarded",
    "system_exit": "idempotent",
    "keyboard_interrupt": "unguarded",
    "hostile": "unguarded",
    "plain_base": "unguarded",
}


def _agent(tool_name: str, execute: Any, effect: str) -> Agent:
    window = {"dedup_window_ms": 60_000} if effect == "idempotent" else {}
    faulty = tool(name=tool_name, description="Fails.", input=NoInput, effect=effect, execute=execute, **window)  # type: ignore[arg-type]
    return Agent(
        name=f"fault_{tool_name}",
        instructions="Call the tool, then answer.",
        model=ScriptedModel([call(tool_name), say(f"after {tool_name}")]),
        tools=[faulty],
        permissions=Permissions.allow_all(),
    )


TOOL_AGENTS = [_agent(name, _raiser(name, exc), EFFECTS[name]) for name, exc in FAULTS.items()]
TOOL_AGENTS += [
    _agent(f"async_{name}", _async_raiser(f"async_{name}", exc), "unguarded")
    for name, exc in FAULTS.items()
    if name in ("needs_arguments", "system_exit", "hostile")
]
# The worker loads the agents a module holds as attributes.
globals().update({agent.name: agent for agent in TOOL_AGENTS})


def _echo(inp: NoInput, ctx: Any) -> str:
    _count("hooked_echo")
    return "echoed"


class HookedAgent(Agent):
    """Its deciding hook and its observing hook raise a BaseException no one can print or pickle."""

    def before_tool(self, call: Any, ctx: Any) -> Any:
        raise Hostile()

    def on_stop(self, stop: Any, ctx: Any) -> None:
        raise Hostile()


hooked = HookedAgent(
    name="fault_hooked",
    instructions="Call echo, then answer.",
    model=ScriptedModel([call("hooked_echo"), say("after the hook")]),
    tools=[tool(name="hooked_echo", description="Echo.", input=NoInput, effect="read_only", execute=_echo)],
    permissions=Permissions.allow_all(),
)


class StepHookAgent(Agent):
    """Its context hook ends the step with SystemExit: the run must end in error, saying so."""

    def before_step(self, ctx: Any) -> str:
        raise SystemExit("from before_step")


step_hooked = StepHookAgent(name="fault_step_hook", instructions="Answer.", model=ScriptedModel([say("never")]))


def exiting_deps() -> Any:
    """A dependency factory that calls sys.exit."""
    raise SystemExit("the factory quit")


_pydantic = PydanticAgent(name="fault_deps_source", instructions="Answer.")


@_pydantic.tool_plain
def nothing() -> str:
    """Does nothing."""
    return "nothing"


deps_exits = from_pydantic_ai(_pydantic, name="fault_deps", deps=exiting_deps, model=ScriptedModel([say("never")]))

next_run = Agent(name="fault_next", instructions="Answer.", model=ScriptedModel([say("next run done")]))

ALL_AGENTS = (*TOOL_AGENTS, hooked, step_hooked, deps_exits, next_run)
