"""Subagents: child agents an owning agent creates and talks to across turns.

Relationships are declared on the owning agent (``Agent(subagents=[SubagentRelationship(...)])``),
never as tool configuration. For each agent with non-hidden relationships the runtime injects
three lifecycle tools: ``subagents`` (list this thread's instances), ``subagent_create`` (start an
instance with a first message and await its reply) and ``subagent_message`` (send an instance
another message and await the reply). An instance is a child thread: durable, and resumable
after any crash, because each exchange is an agent-tool run on that thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from threads_celery.definitions.agents import Agent
from threads_celery.definitions.tools import RESERVED_TOOL_NAMES, Tool, tool
from threads_celery.exceptions import ConfigError
from threads_celery.records import CallRow, Run

if TYPE_CHECKING:
    from threads_celery.runtime.machine import Runtime


@dataclass(frozen=True, slots=True)
class SubagentRelationship:
    """The owning agent may create instances of ``agent`` under ``name``."""

    name: str
    agent: Agent
    description: str = ""
    hidden: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.agent, Agent):
            agent = self.agent() if isinstance(self.agent, type) and issubclass(self.agent, Agent) else None
            if agent is None:
                raise ConfigError(f"subagent {self.name!r}: agent must be an Agent")
            object.__setattr__(self, "agent", agent)
        if not self.name or not isinstance(self.name, str):
            raise ConfigError("a subagent relationship needs a name")
        if self.name in RESERVED_TOOL_NAMES:
            raise ConfigError(f"subagent relationship name {self.name!r} is reserved")


class ListIn(BaseModel):
    pass


class CreateIn(BaseModel):
    subagent: str = Field(description="Which kind of subagent to create (a relationship name).")
    message: str = Field(description="The first message for the new instance.")


class MessageIn(BaseModel):
    instance_id: str = Field(description="The instance to talk to (from subagents or subagent_create).")
    message: str = Field(description="What to tell it.")


def lifecycle_tools(relationships: list[SubagentRelationship]) -> list[Tool]:
    """The tools injected for an agent's non-hidden relationships (none if there are none)."""
    visible = [r for r in relationships if not r.hidden]
    if not visible:
        return []
    kinds = "; ".join(f"{r.name}: {r.description or r.agent.name}" for r in visible)

    def definition(name: str, description: str, model: type[BaseModel], op: str) -> Tool:
        built = tool(name="x_" + name, description=description, input=model, execute=_dispatched, effect="read_only")
        return replace(built, name=name, subagent_op=op)

    return [
        definition("subagents", "List the subagent instances of this conversation.", ListIn, "list"),
        definition(
            "subagent_create", f"Create a subagent instance and get its reply. Kinds: {kinds}", CreateIn, "create"
        ),
        definition("subagent_message", "Send a subagent instance a message and get its reply.", MessageIn, "message"),
    ]


def _dispatched(inp: Any, ctx: Any) -> Any:
    raise RuntimeError("subagent tools are dispatched by the runtime")


def subagent_call(
    runtime: Runtime, run: Run, call: CallRow, agent: Agent, tool_: Tool, parsed: Any, now: datetime
) -> str:
    """Carry out one lifecycle call; errors go back to the model as the call's result."""
    relationships = {r.name: r for r in agent.subagents}
    if tool_.subagent_op == "list":
        with runtime.store.read() as tx:
            rows = tx.list_agent_tool_runs(run.thread_id)
        instances: dict[str, dict[str, Any]] = {}
        for row in rows:
            if not (row.display_name and row.display_name.startswith("subagent:")):
                continue
            if row.child_thread_id is None:
                continue  # refused before it started (the concurrency cap): no instance exists
            instances[row.child_thread_id] = {
                "instance_id": row.child_thread_id,
                "subagent": row.display_name.removeprefix("subagent:"),
                "status": row.status,
                "last_reply": row.summary,
            }
        return runtime._commit_call(run, run.fence, call, tool_, _json(list(instances.values())), is_error=False)
    if tool_.subagent_op == "create":
        relationship = relationships.get(parsed.subagent)
        if relationship is None or relationship.hidden:
            known = ", ".join(sorted(n for n, r in relationships.items() if not r.hidden)) or "none"
            return runtime._commit_call(
                run, run.fence, call, tool_, f"unknown subagent {parsed.subagent!r}; known: {known}", is_error=True
            )
        return runtime._dispatch_child(
            run, call, _labelled(tool_, relationship), parsed, now, child=relationship.agent, input_value=parsed.message
        )
    if tool_.subagent_op == "message":
        with runtime.store.read() as tx:
            thread = tx.get_thread(parsed.instance_id)
        relationship = next(
            (r for r in relationships.values() if thread is not None and r.agent.name == thread.agent), None
        )
        if thread is None or thread.parent_thread_id != run.thread_id or relationship is None:
            return runtime._commit_call(
                run, run.fence, call, tool_, f"unknown subagent instance {parsed.instance_id!r}", is_error=True
            )
        return runtime._dispatch_child(
            run,
            call,
            _labelled(tool_, relationship),
            parsed,
            now,
            child=relationship.agent,
            child_thread_id=thread.id,
            input_value=parsed.message,
        )
    raise ConfigError(f"unknown subagent operation {tool_.subagent_op!r}")


def _labelled(tool_: Tool, relationship: SubagentRelationship) -> Tool:
    return replace(tool_, display_name=f"subagent:{relationship.name}")


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
