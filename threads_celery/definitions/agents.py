"""Agent definitions and the per-process registry that workers resolve agents from.

An agent is code (instructions, a model, tools) that must exist in every worker process; the
store only ever holds its name and a fingerprint of its configuration. A thread is pinned to that
fingerprint: changing an agent's tools or settings under a live thread is a ConfigError, because a
config change starts a new thread.

Subagents are child agents an owning agent creates and talks to across turns. Relationships are
declared on the owning agent (``Agent(subagents=[SubagentRelationship(...)])``), never as tool
configuration. For each agent with non-hidden relationships three lifecycle tools are added to
what its model sees: ``subagents`` (list this thread's instances), ``subagent_create`` (start an
instance with a first message and await its reply) and ``subagent_message`` (send an instance
another message and await the reply). An instance is a child thread: durable, and resumable
after any crash, because each exchange is an agent-tool run on that thread (the runtime carries
the calls out: :mod:`threads_celery.runtime.subagents`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field

from threads_celery.decisions.backbone import check_queue_name
from threads_celery.decisions.deploys import VERSIONING_POLICIES
from threads_celery.decisions.permissions import Permissions
from threads_celery.decisions.usage import UsageLimits
from threads_celery.definitions.hooks import HOOK_POINTS
from threads_celery.definitions.mcp_servers import mcp_tools
from threads_celery.definitions.tools import RESERVED_TOOL_NAMES, Tool, tool
from threads_celery.definitions.variables import declared
from threads_celery.exceptions import ConfigError, UnknownAgent

if TYPE_CHECKING:
    from threads_celery.definitions.hooks import HookAnswer, HookCall, HookContext, HookResult, Stop
    from threads_celery.records import AgentToolFailure, AgentToolResult, AgentToolRun

AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")
DEFAULT_MAX_STEPS = 50

Instructions = str | Callable[[], str]


class Agent:
    """An agent: instructions, a model and tools, advanced one durable step at a time.

    Build one directly, ``Agent(name=..., instructions=..., model=..., tools=[...])``, or subclass
    and set the same names as class attributes (hooks for agent tools are methods on the
    subclass). ``model`` is a pydantic-ai model object or a model string such as
    ``"openai:gpt-4o-mini"``.
    """

    name: ClassVar[str] = ""
    instructions: Instructions = ""
    model: Any = None
    tools: Sequence[Tool] = ()
    subagents: Sequence[Any] = ()
    variables: Sequence[Any] = ()
    #: MCP servers whose tools this agent can call (see :mod:`threads_celery.definitions.mcp_servers`).
    mcp_servers: Sequence[Any] = ()
    permissions: Any = None
    max_steps: int = DEFAULT_MAX_STEPS
    deps: Any = None
    #: At most this many agent-tool runs (of any child agent) running at once per parent thread;
    #: a launch past the cap fails fast with an error row (None: no cap).
    max_concurrent_agent_tools: int | None = None
    #: How long an awaited child may run before it is given up on and torn down (None: no limit).
    agent_tool_max_window_ms: float | None = None
    #: The Celery queue of this agent's model steps (None: the default work queue, ``threads``).
    #: Its tools take their own ``queue=``, if any; control tasks always keep ``threads.control``.
    queue: str | None = None
    #: Objects whose hook methods run after the agent's own (see :mod:`threads_celery.definitions.hooks`).
    hooks: Sequence[Any] = ()
    #: How long one hook call may take before it is cut off and treated by its kind.
    hook_timeout_s: float = 5.0
    #: Caps on model usage per run, per thread and per agent per day (see :mod:`threads_celery.decisions.usage`).
    usage_limits: UsageLimits | None = None
    #: What a deploy does to this agent's runs (see :mod:`threads_celery.decisions.deploys`):
    #: ``pinned`` (the default) keeps each run on the version it started on; ``upgrade`` moves it
    #: to the current version at a step boundary, once a compatibility check passes.
    versioning: str = "pinned"

    def __init__(
        self,
        name: str | None = None,
        instructions: Instructions | None = None,
        model: Any = None,
        tools: Sequence[Tool] | None = None,
        *,
        subagents: Sequence[Any] | None = None,
        variables: Sequence[Any] | None = None,
        permissions: Any = None,
        max_steps: int | None = None,
        deps: Any = None,
        queue: str | None = None,
        hooks: Sequence[Any] | None = None,
        hook_timeout_s: float | None = None,
        mcp_servers: Sequence[Any] | None = None,
        usage_limits: UsageLimits | None = None,
        versioning: str | None = None,
    ) -> None:
        # Instance attributes shadow the class attributes, so subclasses may set either. ``name``
        # is declared a ClassVar for subclasses, which mypy forbids setting on an instance.
        self.name = name if name is not None else (type(self).name or type(self).__name__)  # type: ignore[misc]
        if instructions is not None:
            self.instructions = instructions
        if model is not None:
            self.model = model
        self.tools = tuple(tools if tools is not None else type(self).tools)
        self.subagents = tuple(subagents if subagents is not None else type(self).subagents)
        self.variables = tuple(variables if variables is not None else type(self).variables)
        if permissions is not None:
            self.permissions = permissions
        if max_steps is not None:
            self.max_steps = max_steps
        if deps is not None:
            self.deps = deps
        if queue is not None:
            self.queue = queue
        if usage_limits is not None:
            self.usage_limits = usage_limits
        if versioning is not None:
            self.versioning = versioning
        self.hooks = tuple(hooks if hooks is not None else type(self).hooks)
        if hook_timeout_s is not None:
            self.hook_timeout_s = hook_timeout_s
        self.mcp_servers = tuple(mcp_servers if mcp_servers is not None else type(self).mcp_servers)
        if self.mcp_servers:
            # Listed now, so the servers' tools are pinned in the config fingerprint.
            self.tools = (*self.tools, *mcp_tools(self.name, self.mcp_servers))
        self._validate()
        #: What the model sees: the agent's tools plus the injected subagent lifecycle tools.
        self.runtime_tools: tuple[Tool, ...] = (*self.tools, *lifecycle_tools(list(self.subagents)))
        self._tools_by_name = {t.name: t for t in self.runtime_tools}
        #: The tools whose call is the run's output (Pydantic AI's output tools), counted together.
        self.output_tool_names = frozenset(t.name for t in self.runtime_tools if t.output_retries is not None)

    def _validate(self) -> None:
        if not isinstance(self.name, str) or not AGENT_NAME.match(self.name):
            raise ConfigError(
                f"agent name {self.name!r} is invalid: start with a letter; use letters, digits, "
                "'_', '-' or '.' (at most 128 characters)"
            )
        if self.model is None:
            raise ConfigError(f"agent {self.name!r} needs a model (a model string or object)")
        if self.usage_limits is not None and not isinstance(self.usage_limits, UsageLimits):
            raise ConfigError(
                f"agent {self.name!r}: usage_limits must be a UsageLimits(...), not {self.usage_limits!r}"
            )
        if self.versioning not in VERSIONING_POLICIES:
            raise ConfigError(
                f"agent {self.name!r}: versioning must be one of {', '.join(VERSIONING_POLICIES)}, not {self.versioning!r}"
            )
        refused = check_queue_name(f"agent {self.name!r}", self.queue)
        if refused is not None:
            raise ConfigError(refused)
        for relationship in self.subagents:
            if not isinstance(relationship, SubagentRelationship):
                raise ConfigError(f"agent {self.name!r}: subagents must be SubagentRelationship(...) values")
        seen: set[str] = set()
        for t in self.tools:
            if isinstance(t, SubagentRelationship):
                raise ConfigError(
                    f"agent {self.name!r}: subagent {t.name!r} is a relationship, not a tool; declare it "
                    "on the owning agent with subagents=[...]"
                )
            if not isinstance(t, Tool):
                raise ConfigError(f"agent {self.name!r}: tools must be built with tool(...), got {type(t).__name__}")
            if t.name in seen:
                raise ConfigError(f"agent {self.name!r}: two tools are named {t.name!r}")
            seen.add(t.name)
        if self.permissions is None:
            self.permissions = Permissions()
        elif not isinstance(self.permissions, Permissions):
            raise ConfigError(f"agent {self.name!r}: permissions must be a Permissions value")
        self.declared_variables(tree=True)  # two different declarations of a name: ConfigError
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ConfigError(f"agent {self.name!r}: max_steps must be a positive integer")
        self._validate_hooks()

    def _validate_hooks(self) -> None:
        timeout = self.hook_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ConfigError(
                f"agent {self.name!r}: hook_timeout_s must be a positive number of seconds, not {timeout!r}"
            )
        for extra in self.hooks:
            if not any(callable(getattr(extra, point, None)) for point in HOOK_POINTS):
                raise ConfigError(
                    f"agent {self.name!r}: hooks entry {extra!r} defines none of the hook methods "
                    f"({', '.join(HOOK_POINTS)})"
                )

    # -- hook points (override in a subclass; see threads_celery.definitions.hooks) ---------------------
    # The runtime calls only the ones a subclass overrides: an agent without hooks pays nothing.

    def before_tool(self, call: HookCall, ctx: HookContext) -> HookAnswer | None:
        """Deciding: return ``Allow()``, ``Deny(reason)`` or ``Modify(args)`` for a tool call."""
        return None

    def before_subagent(self, call: HookCall, ctx: HookContext) -> HookAnswer | None:
        """Deciding: as ``before_tool``, for a call that starts a child run (agent tool, subagent)."""
        return None

    def before_step(self, ctx: HookContext) -> str | None:
        """Context: text to add to this model step's instructions (a failure stops the step)."""
        return None

    def after_tool(self, call: HookCall, result: HookResult, ctx: HookContext) -> None:
        """Observing: a call's result, once it is recorded."""

    def after_subagent(self, run: AgentToolRun, result: AgentToolResult | AgentToolFailure) -> None:
        """Observing: a child run's result, as it is delivered to this agent."""

    def on_stop(self, stop: Stop, ctx: HookContext) -> None:
        """Observing: the run ended (``stop.status``, ``stop.output``, ``stop.error``)."""

    def preflight(self) -> None:
        """Raise ConfigError if this agent cannot run in this process; checked before each model step.

        The default checks nothing. An adapter overrides it (e.g. to build its tools'
        dependencies), so a run that cannot work fails at its step with that error, not mid-call.
        """

    def tool_named(self, name: str) -> Tool | None:
        """The tool of that name, or None."""
        return self._tools_by_name.get(name)

    def system_prompt(self) -> str:
        """The instructions as text (callables are evaluated on each model turn)."""
        value = self.instructions() if callable(self.instructions) else self.instructions
        return value or ""

    def model_identity(self) -> str:
        """A stable name for the configured model, used in the config fingerprint."""
        if isinstance(self.model, str):
            return self.model
        system = getattr(self.model, "system", "")
        model_name = getattr(self.model, "model_name", type(self.model).__name__)
        return f"{system}:{model_name}"

    def config_hash(self) -> str:
        """A digest of the configuration a live thread is pinned to."""
        instructions = (
            self.instructions
            if isinstance(self.instructions, str)
            else (getattr(self.instructions, "__qualname__", repr(self.instructions)))
        )
        payload = {
            "name": self.name,
            "instructions": instructions,
            "model": self.model_identity(),
            "tools": [t.fingerprint() for t in self.tools],
            "max_steps": self.max_steps,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]

    def declared_variables(self, *, tree: bool = False) -> dict[str, Any]:
        """Variables declared by this agent and its tools (and with ``tree``, its child agents')."""
        found = list(self.variables)
        for t in self.tools:
            found.extend(t.variables)
            if tree and t.child_agent is not None:
                found.extend(t.child_agent.declared_variables(tree=True).values())
        return declared(found)

    def describe(self) -> dict[str, Any]:
        """What the store records of this agent (no code, no secrets)."""
        return {
            "name": self.name,
            "model": self.model_identity(),
            "queue": self.queue,
            "tools": [
                {"name": t.name, "effect": t.effect, "ends_turn": t.ends_turn, "queue": t.queue} for t in self.tools
            ],
            "variables": {
                v.name: {"type": v.type, "required": v.required, "scoped": v.scoped}
                for v in self.declared_variables(tree=True).values()
            },
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} tools={[t.name for t in self.tools]}>"


# -- subagents: relationships and the lifecycle tools they add -------------------------------------


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
        built = tool(
            name="x_" + name,
            description=description,
            input=model,
            execute=_carried_out_by_the_runtime,
            effect="read_only",
        )
        return replace(built, name=name, subagent_op=op)

    return [
        definition("subagents", "List the subagent instances of this conversation.", ListIn, "list"),
        definition(
            "subagent_create", f"Create a subagent instance and get its reply. Kinds: {kinds}", CreateIn, "create"
        ),
        definition("subagent_message", "Send a subagent instance a message and get its reply.", MessageIn, "message"),
    ]


def _carried_out_by_the_runtime(inp: Any, ctx: Any) -> Any:
    raise RuntimeError("subagent tools are dispatched by the runtime")


class AgentRegistry:
    """The agents this process can run, by name. Thread-safe; later registrations must agree."""

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._lock = threading.Lock()

    def add(self, agent: Agent) -> Agent:
        """Register ``agent``; a different agent under a taken name is a ConfigError."""
        if not isinstance(agent, Agent):
            raise ConfigError(f"can only register Agent instances, not {type(agent).__name__}")
        with self._lock:
            current = self._agents.get(agent.name)
            if current is not None and current is not agent and current.config_hash() != agent.config_hash():
                raise ConfigError(f"agent name {agent.name!r} is already registered with another configuration")
            self._agents[agent.name] = agent
        children = [t.child_agent for t in agent.tools if t.child_agent is not None]
        children += [r.agent for r in agent.subagents]
        for child in children:
            if child.name not in self._agents:
                self.add(child)
        return agent

    def get(self, name: str) -> Agent:
        """The agent of that name; UnknownAgent if this process never loaded it."""
        try:
            return self._agents[name]
        except KeyError:
            known = ", ".join(sorted(self._agents)) or "none"
            raise UnknownAgent(
                f"agent {name!r} is not loaded in this process (loaded: {known}); "
                "set THREADS_AGENTS to the module that defines it"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._agents

    def __iter__(self) -> Iterator[Agent]:
        return iter(list(self._agents.values()))

    def load(self, specs: str | Iterable[str]) -> list[Agent]:
        """Import agents from ``module`` or ``module:attribute`` specs (comma-separated).

        A bare module registers every Agent instance at its top level.
        """
        if isinstance(specs, str):
            specs = [s.strip() for s in specs.split(",") if s.strip()]
        loaded: list[Agent] = []
        for spec in specs:
            loaded.extend(self.add(a) for a in import_agents(spec))
        return loaded


def import_agents(spec: str, *, shown: str | None = None) -> list[Agent]:
    """The agents named by ``module:attribute``, or every top-level Agent in ``module``.

    ``shown`` is how messages name the module (the path the user wrote, ``examples/demo.py``)."""
    module_name, _, attribute = spec.partition(":")
    where = shown or f"module {module_name!r}"
    # `celery -A tasks worker` does not put the working directory on the path; agents usually
    # live in the project the worker is started from.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import agent module {module_name!r}: {exc}") from exc
    except Exception as exc:  # a module that fails while importing is the same mistake, found at start-up
        raise ConfigError(f"cannot import agent module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    if attribute:
        missing = object()
        value = getattr(module, attribute, missing)
        if isinstance(value, type) and issubclass(value, Agent):
            value = value()
        if not isinstance(value, Agent):
            named = [name for name, v in vars(module).items() if isinstance(v, Agent)]
            has = f"the Agents it has: {', '.join(named)}" if named else "it has no Agent at its top level"
            if value is missing:
                raise ConfigError(f"there is no attribute {attribute!r} in {where} ({has})")
            raise ConfigError(f"{attribute!r} in {where} is not an Agent but of type {type(value).__name__} ({has})")
        return [value]
    agents = [v for v in vars(module).values() if isinstance(v, Agent)]
    if not agents:
        raise ConfigError(f"{where} defines no Agent at its top level")
    return agents
