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
import dataclasses
import hashlib
import importlib
import inspect
import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ValidationError
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.messages import InstructionPart, ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RunUsage

from threads_celery.decisions.effects import Reconcile
from threads_celery.decisions.permissions import Permissions
from threads_celery.definitions.agents import Agent
from threads_celery.definitions.mcp_servers import MCPServer
from threads_celery.definitions.model_strings import resolve_model
from threads_celery.definitions.pydantic_ai_capabilities import carried_capabilities
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

    output = OutputTools.of(agent, owner, context=lambda: _run_context(holder["agent"]))
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
) -> Any:
    model = agent.model.inner if isinstance(agent.model, DurableModel) else agent.model
    return RunContext(
        deps=agent.built_deps(),
        model=model,
        usage=RunUsage(),
        tool_name=tool_name,
        tool_call_id=call_key,
        retry=retry,
    )


# -- tools ----------------------------------------------------------------------------------------


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
        run_ctx = _run_context(
            holder["agent"],
            tool_name=pai_tool.name,
            call_key=ctx.effect_key,
            retry=ctx.model_retries,
        )
        return await schema.call(arguments.values, run_ctx)

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


# -- the model ------------------------------------------------------------------------------------


class DurableModel(WrapperModel):
    """The agent's model with its model settings, and its output type offered as an output tool.

    The wrapped model is resolved on first use, so building the agent (in a web app, say) needs
    no provider credentials.
    """

    def __init__(
        self,
        model: Any,
        *,
        settings: dict[str, Any],
        output: OutputTools | None,
        instructions: _Prompt | None = None,
        prepared: Mapping[str, Any] | None = None,
        context: Callable[[], Any] | None = None,
    ) -> None:
        Model.__init__(self)
        self._spec = model
        self._agent_settings = settings
        self._output = output
        self._instructions = instructions
        #: Tools with a ``prepare`` function (pydantic_ai Tool), by name: asked on each model turn.
        self._prepared = dict(prepared or {})
        self._context = context
        self._inner: Model | None = None
        self._lock = threading.Lock()

    # WrapperModel declares ``wrapped`` a field; here it is resolved lazily (a model string needs
    # credentials only when a request is made), so a read-only property stands in for it.
    @property
    def wrapped(self) -> Model:  # type: ignore[override]
        return self.inner

    def __repr__(self) -> str:
        # Never resolve the model to show it: a missing key must not turn a message into an error.
        return repr(self._spec) if isinstance(self._spec, str) else f"DurableModel({self._spec!r})"

    @property
    def unresolved_spec(self) -> str | None:
        """The model string not resolved yet (None once resolved, or for a model object)."""
        return self._spec if isinstance(self._spec, str) and self._inner is None else None

    @property
    def inner(self) -> Model:
        """The wrapped pydantic-ai model (resolved from a model string on first use)."""
        with self._lock:
            if self._inner is None:
                self._inner = resolve_model(self._spec)
            return self._inner

    @property
    def model_name(self) -> str:
        if isinstance(self._spec, str):
            return self._spec.partition(":")[2] or self._spec
        return str(self.inner.model_name)

    @property
    def system(self) -> str:
        if isinstance(self._spec, str):
            return self._spec.partition(":")[0]
        return str(self.inner.system)

    def _merged_settings(self, model_settings: ModelSettings | None) -> ModelSettings | None:
        merged: dict[str, Any] = {**self._agent_settings, **dict(model_settings or {})}
        # The agent's settings are the user's plain dict: its keys are pydantic-ai's to check.
        return ModelSettings(**merged) if merged else None  # type: ignore[typeddict-item]

    def _parameters(self, params: ModelRequestParameters) -> ModelRequestParameters:
        if self._output is None:
            return params
        names = self._output.processors
        return dataclasses.replace(
            params,
            function_tools=[t for t in params.function_tools if t.name not in names],
            output_tools=list(self._output.definitions),
            output_mode="tool",
            allow_text_output=False,
        )

    async def _finalise(self, response: ModelResponse) -> ModelResponse:
        """A valid output call becomes the answer's text (the run's output); one that fails its
        type or an output validator is left as a call of the output tool, which tells the model why."""
        if self._output is None:
            return response
        for part in response.parts:
            if isinstance(part, ToolCallPart) and part.tool_name in self._output.processors:
                try:
                    value = await self._output.finished(part.tool_name, part.args)
                except (ValidationError, ValueError, ModelRetry):
                    return response
                except Exception as exc:  # noqa: BLE001 - an output validator failed: the run ends saying so
                    raise AgentCodeFailed(
                        f"an output validator raised {describe_exception(exc, known_secrets())}"
                    ) from None
                return dataclasses.replace(response, parts=[TextPart(content=self._output.to_json(value))])
        return response

    def _streams(self) -> bool:
        inner = self.inner
        return not (isinstance(inner, FunctionModel) and inner.stream_function is None)

    async def _with_instructions(
        self, messages: list[ModelMessage], params: ModelRequestParameters
    ) -> tuple[list[ModelMessage], ModelRequestParameters]:
        """The agent's instructions on the request, as Pydantic AI sends them: on the last request
        and as the request's instruction parts."""
        if self._prepared:
            params = dataclasses.replace(params, function_tools=await self._prepare_tools(params.function_tools))
        text = await self._instructions.text_async() if self._instructions is not None else ""
        if not text:
            return messages, params
        if messages and isinstance(messages[-1], ModelRequest):
            messages = [*messages[:-1], dataclasses.replace(messages[-1], instructions=text)]
        return messages, dataclasses.replace(params, instruction_parts=[InstructionPart(content=text)])

    async def _prepare_tools(self, definitions: Sequence[ToolDefinition]) -> list[ToolDefinition]:
        """Each tool with a ``prepare`` function as that function shapes it for this turn (or left
        out when it returns None), as Pydantic AI asks it on every step."""
        prepared: list[ToolDefinition] = []
        for definition in definitions:
            pai_tool = self._prepared.get(definition.name)
            if pai_tool is None:
                prepared.append(definition)
                continue
            try:
                shaped = await pai_tool.prepare_tool_def(self._context() if self._context is not None else None)
            except Exception as exc:  # noqa: BLE001 - the agent's code: the run ends saying so
                raise AgentCodeFailed(
                    f"the prepare function of tool {definition.name!r} raised {describe_exception(exc, known_secrets())}"
                ) from None
            if shaped is not None:
                prepared.append(shaped)
        return prepared

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        messages, model_request_parameters = await self._with_instructions(messages, model_request_parameters)
        params = self._parameters(model_request_parameters)
        return await self._finalise(await self.inner.request(messages, self._merged_settings(model_settings), params))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        messages, model_request_parameters = await self._with_instructions(messages, model_request_parameters)
        params = self._parameters(model_request_parameters)
        settings = self._merged_settings(model_settings)
        if self._output is None and self._streams():
            async with self.inner.request_stream(messages, settings, params, run_context) as stream:
                yield stream
            return
        # Whether the output call is valid is only known once the answer is complete (and a
        # FunctionModel without a stream function answers whole): take the answer whole.
        response = await self._finalise(await self.inner.request(messages, settings, params))
        yield CompletedStreamedResponse(response, model_request_parameters=params, replay_events=True)


__all__ = ["PydanticAIAgent", "factory_reference", "from_pydantic_ai", "resolve_factory"]
