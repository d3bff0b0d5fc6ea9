"""An existing Pydantic AI agent, made durable: ``from_pydantic_ai(agent, effects=..., deps=...)``.

The adapter reads what a ``pydantic_ai.Agent`` was built with and returns a threads-celery
:class:`~threads_celery.definitions.agents.Agent` that does the same, one durable step at a time:

- its system prompts and instructions (strings, and functions with or without a ``RunContext``,
  sync or async);
- its capabilities that add model settings, instructions or plain function tools
  (:mod:`.pydantic_ai_capabilities`);
- its function tools (``@agent.tool``, ``@agent.tool_plain``, ``tools=[...]``), each a durable tool
  call whose effect the author states in ``effects={...}``; a tool with no stated effect is
  unguarded, so it asks a person first under the default permission mode;
- its output type: a structured ``output_type`` is offered to the model through the output tools
  Pydantic AI's own output schema builds (one type, a list, a union with one tool per member,
  ``ToolOutput``), and the run's output is the validated value as JSON (see
  :meth:`PydanticAIAgent.parse_output`);
- its model and model settings.

Tool dependencies are built in the worker by a factory the author names (``deps=``): a
module-level function or a ``"module:function"`` path, called once per worker thread. A factory
that cannot be imported or fails ends the run at its model step with a clear error, before any
tool runs. Tools see a ``RunContext`` whose ``deps`` are those dependencies and whose
``tool_call_id`` is the call's effect key (stable across reruns: an idempotency key).

What does not carry over is a ConfigError rather than a silent difference: other toolsets
(give MCP servers to ``Agent(mcp_servers=...)`` instead),
capabilities that hook into runs, requests or tool calls, ``NativeOutput``, ``PromptedOutput``, output
functions and output specs that also allow text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import hashlib
import importlib
import inspect
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai.usage import RunUsage

from threads_celery.decisions.effects import Reconcile
from threads_celery.decisions.permissions import Permissions
from threads_celery.definitions.agents import Agent
from threads_celery.definitions.context import current_run_step
from threads_celery.definitions.mcp_servers import MCPServer
from threads_celery.definitions.pydantic_ai_capabilities import carried_capabilities
from threads_celery.definitions.pydantic_ai_model import DurableModel
from threads_celery.definitions.pydantic_ai_outputs import OutputTools
from threads_celery.definitions.schema_tools import EffectChoice, SchemaTool, ToolArguments, schema_tool, stated_effect
from threads_celery.definitions.tools import ToolArgumentsError, describe_validation_error
from threads_celery.exceptions import AgentCodeFailed, ConfigError
from threads_celery.redaction import describe_exception, known_secrets

DepsFactory = Callable[[], Any]


class PydanticAIAgent(Agent):
    """A threads-celery agent built from a ``pydantic_ai.Agent`` by :func:`from_pydantic_ai`."""

    #: The Pydantic AI agent's ``output_type`` (``str`` for text output).
    output_type: Any = str
    #: ``"module:function"`` of the factory that builds the tools' dependencies (None: no deps).
    deps_factory: str | None = None

    def __init__(
        self,
        *args: Any,
        output_type: Any = str,
        deps_factory: str | None = None,
        output: OutputTools | None = None,
        prompt_names: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        self.output_type = output_type
        self.deps_factory = deps_factory
        self._deps_by_thread = threading.local()
        self._output = output
        self._prompt_names = list(prompt_names)
        super().__init__(*args, **kwargs)

    def preflight(self) -> None:
        """Build the tools' dependencies in this worker thread (once); ConfigError if they cannot be."""
        self.built_deps()

    def built_deps(self) -> Any:
        """The tools' dependencies for this worker thread, built by the factory on first use."""
        if self.deps_factory is None:
            return None
        cached = getattr(self._deps_by_thread, "value", _MISSING)
        if cached is not _MISSING:
            return cached
        factory = resolve_factory(self.deps_factory)
        try:
            value = factory()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - reported the same way
            # The factory's own SystemExit must not end the worker's pool process (any other
            # BaseException is the task's failure, handled where the runtime's own signals are
            # told apart); the description never raises (a hostile __str__ is named instead).
            raise ConfigError(
                f"the dependencies of agent {self.name!r} cannot be built in this worker: "
                f"{self.deps_factory} raised {describe_exception(exc, known_secrets())}"
            ) from None
        self._deps_by_thread.value = value
        return value

    def parse_output(self, text: str | None) -> Any:
        """A finished run's output as the Pydantic AI agent's ``output_type`` (text stays text).

        Raises ValueError when the text is not a valid value of that type.
        """
        if self._output is None:
            return text
        return self._output.parse_json(text or "")

    def config_hash(self) -> str:
        """The base fingerprint, plus the output type, the dependency factory and the prompt's parts
        (the instructions travel with the model, not as the agent's own instructions)."""
        extra = json.dumps(
            {
                "output": self._output.fingerprint if self._output else None,
                "deps": self.deps_factory,
                "prompt": self._prompt_names,
            },
            sort_keys=True,
        )
        return hashlib.sha256((super().config_hash() + extra).encode()).hexdigest()[:32]


_MISSING = object()


def from_pydantic_ai(
    agent: Any,
    *,
    effects: Mapping[str, EffectChoice] | None = None,
    deps: DepsFactory | str | None = None,
    dedup_window_ms: int | Mapping[str, int] | None = None,
    name: str | None = None,
    model: Any = None,
    permissions: Permissions | None = None,
    max_steps: int | None = None,
    mcp_servers: Sequence[MCPServer] | None = None,
) -> PydanticAIAgent:
    """A durable threads-celery agent that does what the Pydantic AI ``agent`` does.

    ``effects`` maps tool names to their effect (an effect name, or a
    :class:`~threads_celery.decisions.effects.Reconcile`); an unstated tool is unguarded.
    ``dedup_window_ms`` is the window of the idempotent ones (a number, or a mapping by tool
    name). ``deps`` names the factory of the tools' dependencies (a module-level function or a
    ``"module:function"`` path). ``name`` and ``model`` default to the agent's own. Tools built
    with ``requires_approval=True`` ask first whatever their effect, unless ``permissions`` is
    given. ``mcp_servers`` adds the tools of MCP servers (see
    :class:`~threads_celery.definitions.mcp_servers.MCPServer`), in place of Pydantic AI's MCP toolsets.
    """
    if not isinstance(agent, PydanticAgent):
        raise ConfigError(f"from_pydantic_ai takes a pydantic_ai.Agent, not {type(agent).__name__}")
    agent_name = name or agent.name
    if not agent_name:
        raise ConfigError("the Pydantic AI agent has no name: pass from_pydantic_ai(agent, name=...)")
    owner = f"agent {agent_name!r}"
    base_model = model if model is not None else agent.model
    if base_model is None:
        raise ConfigError(f"{owner}: the Pydantic AI agent has no model: pass from_pydantic_ai(agent, model=...)")
    _refuse_what_does_not_carry_over(agent, owner)
    carried = carried_capabilities(agent, owner)
    factory_path = factory_reference(owner, deps) if deps is not None else None
    deps_type = getattr(agent, "deps_type", type(None))
    if factory_path is None and deps_type not in (type(None), None, object):
        raise ConfigError(
            f"{owner}: the Pydantic AI agent declares deps_type={getattr(deps_type, '__name__', deps_type)}; "
            "pass deps=<factory> (a module-level function or 'module:function') to build them in the worker"
        )

    output = OutputTools.of(agent, owner, context=lambda run_step: _run_context(holder["agent"], run_step=run_step))
    function_tools: dict[str, Any] = dict(agent._function_toolset.tools)
    for tool_name, pai_tool in carried.tools.items():
        if tool_name in function_tools:
            raise ConfigError(f"{owner}: a capability adds a tool named {tool_name!r}, which the agent has already")
        function_tools[tool_name] = pai_tool
    stated = dict(effects or {})
    unknown = sorted(set(stated) - set(function_tools))
    if unknown:
        raise ConfigError(
            f"{owner}: effects names {', '.join(map(repr, unknown))}, which the agent has no tool of "
            f"(its tools: {', '.join(sorted(function_tools)) or 'none'})"
        )
    clashing = sorted({d.name for d in output.definitions} & set(function_tools)) if output is not None else []
    if clashing:
        raise ConfigError(f"{owner}: a tool may not be named {clashing[0]!r}: it is an output tool of the agent")

    holder: dict[str, PydanticAIAgent] = {}
    tools: list[SchemaTool] = []
    for tool_name, pai_tool in function_tools.items():
        effect, window, reconcile = stated_effect(owner, tool_name, stated.get(tool_name, "unguarded"), dedup_window_ms)
        durable_tool = _durable_tool(pai_tool, effect, window, reconcile, holder)
        limit = pai_tool.max_retries if pai_tool.max_retries is not None else agent._max_tool_retries
        tools.append(dataclasses.replace(durable_tool, max_retries=limit))
    if output is not None:
        limit = agent._max_output_retries
        tools.extend(dataclasses.replace(t, output_retries=limit) for t in output.tools())
    if permissions is None:
        needs_approval = [n for n, t in function_tools.items() if getattr(t, "requires_approval", False)]
        permissions = Permissions(ask=needs_approval)

    # System prompts travel as the run's system prompt; instructions as the request's instructions,
    # as Pydantic AI sends them (a model told apart the two, AgentInfo.instructions for one).
    system_prompt = _Prompt([*agent._system_prompts, *(r.function for r in agent._system_prompt_functions)], holder)
    own: list[str | Callable[..., Any]] = []
    for sourced in agent._instructions:
        part: Any = sourced.instruction
        if not (isinstance(part, str) or callable(part)):
            raise ConfigError(
                f"{owner}: instructions given as a {type(part).__name__} do not carry over; give text or a function"
            )
        own.append(part)
    instructions = _Prompt([*own, *carried.instructions], holder)
    durable = PydanticAIAgent(
        name=agent_name,
        instructions=system_prompt.for_agent(),
        model=DurableModel(
            base_model,
            settings={**_model_settings(agent, owner), **carried.settings},
            output=output,
            instructions=instructions,
            prepared={name: t for name, t in function_tools.items() if getattr(t, "prepare", None) is not None},
            context=lambda: _run_context(holder["agent"]),
        ),
        tools=tools,
        permissions=permissions,
        max_steps=max_steps,
        mcp_servers=mcp_servers,
        output_type=agent.output_type,
        deps_factory=factory_path,
        output=output,
        prompt_names=system_prompt.names + instructions.names,
    )
    holder["agent"] = durable
    return durable


def _model_settings(agent: Any, owner: str) -> dict[str, Any]:
    settings = agent.model_settings
    if callable(settings):
        raise ConfigError(f"{owner}: model settings computed per run do not carry over; give a mapping")
    return dict(settings or {})


# -- dependencies ---------------------------------------------------------------------------------


def factory_reference(owner: str, factory: DepsFactory | str) -> str:
    """The ``"module:qualname"`` a worker imports the factory by; ConfigError if there is none.

    A lambda or a nested function has no such name, so it could not be found again in a worker.
    """
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        if not module or not attribute:
            raise ConfigError(f"{owner}: deps={factory!r} must be 'module:function'")
        return factory
    if not callable(factory):
        raise ConfigError(
            f"{owner}: deps must be a factory function or 'module:function', not {type(factory).__name__}"
        )
    module_name = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", "")
    if not module_name or "<" in qualname:
        raise ConfigError(
            f"{owner}: deps={qualname or factory!r} cannot be imported by name in a worker (a lambda or "
            "a function defined inside another); define it at module level, or pass 'module:function'"
        )
    return f"{module_name}:{qualname}"


def resolve_factory(path: str) -> DepsFactory:
    """Import the factory ``"module:qualname"`` names; ConfigError if it cannot be."""
    module_name, _, qualname = path.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"the dependency factory {path!r} cannot be imported in this worker: {exc}") from None
    if not callable(value):
        raise ConfigError(f"the dependency factory {path!r} is not callable")
    factory: DepsFactory = value
    return factory


def _run_context(
    agent: PydanticAIAgent,
    *,
    tool_name: str | None = None,
    call_key: str | None = None,
    retry: int = 0,
    run_step: int | None = None,
    usage: RunUsage | None = None,
) -> Any:
    """The ``RunContext`` the agent's code is given; ``run_step`` defaults to the model request
    being made now (see :func:`~threads_celery.definitions.context.current_run_step`), ``usage``
    to none used."""
    model = agent.model.inner if isinstance(agent.model, DurableModel) else agent.model
    return RunContext(
        deps=agent.built_deps(),
        model=model,
        usage=RunUsage() if usage is None else usage,
        tool_name=tool_name,
        tool_call_id=call_key,
        retry=retry,
        run_step=current_run_step() if run_step is None else run_step,
    )


# -- tools ----------------------------------------------------------------------------------------


def _usage_so_far(ctx: Any) -> RunUsage:
    """The run's usage up to the reply that asked for this call, as Pydantic AI's ``ctx.usage``
    holds it in a tool: its requests and tokens, and its earlier turns' tool calls that succeeded."""
    totals, tool_calls = ctx.run_usage()
    return RunUsage(
        requests=totals.requests,
        input_tokens=totals.input_tokens,
        output_tokens=totals.output_tokens,
        tool_calls=tool_calls,
    )


def _durable_tool(
    pai_tool: Any,
    effect: str,
    window: int | None,
    reconcile: Reconcile | None,
    holder: dict[str, PydanticAIAgent],
) -> SchemaTool:
    schema = pai_tool.function_schema

    def validate(values: dict[str, Any]) -> dict[str, Any]:
        try:
            validated: dict[str, Any] = schema.validator.validate_python(values)
        except ValidationError as exc:
            raise ToolArgumentsError(describe_validation_error(exc)) from None
        return validated

    async def execute(arguments: ToolArguments, ctx: Any) -> Any:
        usage = _usage_so_far(ctx) if schema.takes_ctx else RunUsage()
        before = copy.copy(usage)
        run_ctx = _run_context(
            holder["agent"],
            tool_name=pai_tool.name,
            call_key=ctx.effect_key,
            retry=ctx.model_retries,
            run_step=ctx.run_step,
            usage=usage,
        )
        try:
            return await schema.call(arguments.values, run_ctx)
        finally:
            # What the tool added to ctx.usage (a delegate agent run with usage=ctx.usage) was
            # billed: the run counts it, as Pydantic AI's does, also when the tool then raised.
            ctx.count_usage(
                requests=max(usage.requests - before.requests, 0),
                input_tokens=max(usage.input_tokens - before.input_tokens, 0),
                output_tokens=max(usage.output_tokens - before.output_tokens, 0),
            )

    return schema_tool(
        name=pai_tool.name,
        description=pai_tool.description or "",
        json_schema=schema.json_schema,
        validate=validate,
        execute=execute,
        effect=effect,
        dedup_window_ms=window,
        reconcile=reconcile,
    )


def _refuse_what_does_not_carry_over(agent: Any, owner: str) -> None:
    if getattr(agent, "_user_toolsets", None) or getattr(agent, "_dynamic_toolsets", None):
        raise ConfigError(
            f"{owner}: the Pydantic AI agent has toolsets, which do not carry over; give MCP servers as "
            "from_pydantic_ai(..., mcp_servers=[threads_celery.MCPServer(...)]) and plain functions as tools"
        )


# -- instructions ---------------------------------------------------------------------------------


class _Prompt:
    """Parts of a prompt as Pydantic AI takes them: strings, and functions with or without a
    ``RunContext``, sync or async, evaluated on each model turn."""

    def __init__(self, parts: Sequence[str | Callable[..., Any]], holder: dict[str, PydanticAIAgent]) -> None:
        self.parts = list(parts)
        self.holder = holder

    @property
    def names(self) -> list[str]:
        """What the configuration fingerprint pins: each string, and each function's name."""
        return [p if isinstance(p, str) else f"{p.__module__}.{p.__qualname__}" for p in self.parts]

    def _values(self) -> list[Any]:
        values: list[Any] = []
        for part in self.parts:
            if isinstance(part, str):
                values.append(part)
                continue
            takes_ctx = len(inspect.signature(part).parameters) > 0
            values.append(part(_run_context(self.holder["agent"])) if takes_ctx else part())
        return values

    def text(self) -> str:
        """The prompt now, from synchronous code (an async part runs on this thread's loop)."""
        return _joined([_await(v) if inspect.isawaitable(v) else v for v in self._values()])

    async def text_async(self) -> str:
        """The prompt now, from a coroutine (an async part is awaited on the caller's loop).

        Raises AgentCodeFailed when a part raises."""
        try:
            return _joined([await v if inspect.isawaitable(v) else v for v in self._values()])
        except Exception as exc:  # noqa: BLE001 - the agent's code: the run ends saying so
            raise AgentCodeFailed(
                f"an instruction function raised {describe_exception(exc, known_secrets())}"
            ) from None

    def for_agent(self) -> str | Callable[[], str]:
        """As ``Agent(instructions=...)`` takes it: the text itself when every part is a string."""
        if all(isinstance(p, str) for p in self.parts):
            return _joined(self.parts)

        def render() -> str:
            return self.text()

        # The config fingerprint reads a callable's __qualname__: make it name every part.
        digest = hashlib.sha256(json.dumps(self.names).encode()).hexdigest()[:16]
        render.__qualname__ = "pydantic_ai_system_prompt:" + digest
        return render


def _joined(values: Sequence[Any]) -> str:
    return "\n\n".join(str(v) for v in values if v)


_loops = threading.local()


def _await(awaitable: Any) -> Any:
    """The value of an async instruction function, awaited on this thread's own event loop (the
    thread's dependencies may be bound to it), or on a thread of its own inside a running loop."""

    async def wrapped() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(_loops, "loop", None)
        if loop is None or loop.is_closed():
            loop = _loops.loop = asyncio.new_event_loop()
        return loop.run_until_complete(wrapped())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wrapped()).result()


__all__ = ["PydanticAIAgent", "factory_reference", "from_pydantic_ai", "resolve_factory"]
