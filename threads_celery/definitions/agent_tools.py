"""Agents as tools, as a user declares them: ``agent_tool(child, ...)`` and ``Detached(...)``.

An agent tool is a :class:`~threads_celery.definitions.tools.Tool` whose call starts a child agent
run on a thread of its own instead of executing code; the parent sees the child's end as a
:class:`~threads_celery.records.AgentToolResult` or an
:class:`~threads_celery.records.AgentToolFailure`. A tool may also start a child in the
background with ``ctx.run_agent_tool(child, detached=Detached(...))`` and gets a
:class:`DetachedHandle` back at once. Starting, watching and delivering child runs is the
ledger's business (:mod:`threads_celery.transitions.agent_tools`) and the runtime's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from threads_celery.definitions.agents import Agent
from threads_celery.definitions.tools import Tool, describe_validation_error, tool
from threads_celery.exceptions import ConfigError

DEFAULT_MAX_BUDGET_MS = 24 * 60 * 60 * 1000
DEFAULT_NO_PROGRESS_BUDGET_MS = 60 * 60 * 1000


class AgentToolInput(BaseModel):
    """The default input of an agent tool: one message for the child."""

    message: str = Field(description="What the agent should do, in plain words.")


@dataclass(frozen=True, slots=True)
class Detached:
    """Options of a detached (background) agent-tool run.

    ``on_finish`` names a method of the parent agent, called once per finish status (never a
    closure: it must survive a task boundary). ``notify`` injects a message into the parent thread
    and gives the parent model a turn (``True`` or ``{"source": ...}``); an explicit ``on_finish``
    wins over it. ``on_milestones``: milestone names to surface (narrate), or
    ``{"names": [...], "mode": "narrate"|"react"}``.
    """

    on_finish: str | None = None
    notify: bool | Mapping[str, str] = False
    on_milestones: list[str] | Mapping[str, Any] | None = None
    max_budget_ms: float | None = DEFAULT_MAX_BUDGET_MS
    no_progress_budget_ms: float | None = DEFAULT_NO_PROGRESS_BUDGET_MS

    def __post_init__(self) -> None:
        for name in ("max_budget_ms", "no_progress_budget_ms"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or value < 0
            ):
                raise ConfigError(f"{name} must be a non-negative number of milliseconds, not {value!r}")
        if self.on_finish is not None and (not isinstance(self.on_finish, str) or not self.on_finish):
            raise ConfigError("on_finish names a method of the parent agent (a string)")


@dataclass(frozen=True, slots=True)
class DetachedHandle:
    """What a detached dispatch returns at once."""

    run_id: str
    agent_type: str
    status: Literal["running", "error"]
    error: str | None = None


def agent_tool(
    child: type[Agent] | Agent,
    description: str,
    *,
    display_name: str | None = None,
    input: type[BaseModel] = AgentToolInput,
    name: str | None = None,
    output: Any = None,
) -> Tool:
    """Expose ``child`` as a tool the parent model can call; the call awaits the child's result.

    With ``output`` (a pydantic model or any type pydantic validates), the child's final output
    (``get_agent_tool_output``, else its last assistant text read as JSON) must fit it: output
    that does not reaches the parent as an :class:`~threads_celery.records.AgentToolFailure`, never as a success.
    """
    agent = child() if isinstance(child, type) else child
    if not isinstance(agent, Agent):
        raise ConfigError(f"agent_tool needs an Agent (class or instance), not {type(child).__name__}")
    tool_name = name or agent.name.lower().replace("-", "_").replace(".", "_")
    if output is not None:
        try:
            TypeAdapter(output)
        except Exception as exc:  # noqa: BLE001 - any type pydantic cannot build a schema for
            raise ConfigError(
                f"agent tool {tool_name!r}: output must be a type pydantic can validate ({exc})"
            ) from None
    # read_only: dispatch is idempotent by run id, so running it again re-attaches; the
    # child's own tools carry their own effects and permissions. ``output`` on the tool is the
    # child's output schema (an agent tool is never executed, so it checks nothing else).
    definition = tool(
        name=tool_name,
        description=description,
        input=input,
        execute=started_by_the_runtime,
        effect="read_only",
        output=output,
    )
    return replace(definition, child_agent=agent, display_name=display_name or agent.name)


def check_child_output(definition: Tool, child_name: str, value: Any) -> tuple[Any, str | None]:
    """The child's output checked against the agent tool's ``output`` schema: (value, error).

    A string is read as JSON first (a model's final text); the value returned is the validated
    one, dumped to JSON-ready data. Pure: no I/O.
    """
    if definition.output is None:
        return value, None
    adapter: TypeAdapter[Any] = TypeAdapter(definition.output)
    label = getattr(definition.output, "__name__", repr(definition.output))
    try:
        checked = adapter.validate_json(value) if isinstance(value, str) else adapter.validate_python(value)
    except ValidationError as exc:
        detail = describe_validation_error(exc).removeprefix("invalid arguments: ")
        return None, f"the output of agent {child_name!r} fails its output schema {label}: {detail}"
    return adapter.dump_python(checked, mode="json"), None


def started_by_the_runtime(inp: Any, ctx: Any) -> Any:
    """The ``execute`` of a tool that starts a child run (agent and prompt tools): never called."""
    raise RuntimeError("agent tools are dispatched by the runtime, not executed")


__all__ = ["AgentToolInput", "Detached", "DetachedHandle", "agent_tool"]
