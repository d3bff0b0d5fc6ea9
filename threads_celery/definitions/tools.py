"""Tool definitions: what the model may call, what it may send, and what a crash means.

A :class:`Tool` is a frozen value built by :func:`tool`. Its input model is the single schema the
model sees and the one that checks the model's arguments before ``execute`` runs, so the two never
drift apart. Every mistake that would make a tool impossible to run safely is a
:class:`~threads_celery.exceptions.ConfigError` at definition time, not at 3 a.m. mid-run.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

from threads_celery.decisions.backbone import check_queue_name
from threads_celery.decisions.effects import EFFECTS, Effect, Reconcile
from threads_celery.exceptions import ConfigError
from threads_celery.records import storable
from threads_celery.redaction import describe_exception

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent
    from threads_celery.definitions.variables import Variable

TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: Providers accept function names of up to 64 characters (OpenAI's limit, the strictest).
MAX_TOOL_NAME = 64
RESERVED_TOOL_NAMES = frozenset({"subagents", "subagent_create", "subagent_message"})

Runs = Literal["host"]


@dataclass(frozen=True, slots=True)
class PromptToolOptions:
    """How a prompt tool's return is shaped and its input mapped (spec-tools.md section 4)."""

    include_text_response: bool = True
    include_tool_calls: bool = False
    include_errors: bool = True
    init_user_message_property: str | None = None
    init_attachments_property: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model can call. Build it with :func:`tool`."""

    name: str
    description: str
    input: type[BaseModel]
    execute: Callable[..., Any]
    runs: Runs = "host"
    effect: Effect = "unguarded"
    ends_turn: bool = False
    output: Any = None
    dedup_window_ms: int | None = None
    reconcile: Reconcile | None = None
    progress_argument: str | None = None
    variables: tuple[Variable, ...] = ()
    queue: str | None = None
    _output_adapter: TypeAdapter[Any] | None = field(default=None, repr=False, compare=False)
    #: Set for agent tools (see :func:`threads_celery.definitions.agent_tools.agent_tool`): the child agent.
    child_agent: Agent | None = field(default=None, repr=False, compare=False)
    display_name: str | None = None
    #: Set for prompt tools (see :mod:`threads_celery.definitions.prompts`): how the return is shaped.
    prompt_options: PromptToolOptions | None = None
    #: Set for the injected subagent lifecycle tools: "list", "create" or "message".
    subagent_op: str | None = None
    #: May run at the same time as the neighbouring concurrent calls of one model reply.
    concurrent: bool = False
    #: May destroy or overwrite what was there (an MCP tool's ``destructiveHint``): under
    #: ``accept_edits`` it asks first, whatever its effect.
    destructive: bool = False
    #: How many model turns in a row may be asked to retry this tool (``ModelRetry``, invalid
    #: arguments) before the run ends in error, as Pydantic AI's ``max_retries`` (None: no limit).
    max_retries: int | None = None
    #: Set on an output tool (``from_pydantic_ai``): how many failed outputs a run may send in all,
    #: over every output tool, before it ends in error (Pydantic AI's output retries).
    output_retries: int | None = None
    #: :meth:`fingerprint`, worked out once: a tool does not change, and its schema is rebuilt by
    #: pydantic on every call (about 0.1 ms), which every ``start()`` with an Agent would pay.
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def gives_output(self) -> bool:
        """An output tool (``from_pydantic_ai``): a successful call ends the run (``ends_turn``)
        with the call's result as the run's output."""
        return self.ends_turn and self.output_retries is not None

    @property
    def is_async(self) -> bool:
        """Whether ``execute`` is a coroutine function."""
        return inspect.iscoroutinefunction(self.execute)

    def parameters_json_schema(self) -> dict[str, Any]:
        """The JSON schema the model sees for this tool's arguments."""
        return self.input.model_json_schema()

    def fingerprint(self) -> str:
        """A stable digest of everything about this tool that a live thread is pinned to."""
        if self._fingerprint is not None:
            return self._fingerprint
        digest = _digest(
            {
                "name": self.name,
                "description": self.description,
                "schema": self.parameters_json_schema(),
                "effect": self.effect,
                "ends_turn": self.ends_turn,
                "dedup_window_ms": self.dedup_window_ms,
                "finality": self.reconcile.finality if self.reconcile else None,
                **({"destructive": True} if self.destructive else {}),
            }
        )
        object.__setattr__(self, "_fingerprint", digest)  # frozen: a cache, not a change
        return digest

    def arguments_of(self, parsed: BaseModel) -> dict[str, Any]:
        """The arguments ``parsed`` stands for, as the model sent them (JSON data): what hooks,
        approvals and a ``Modify`` see and edit."""
        return parsed.model_dump(mode="json")

    def parse_arguments(self, raw: str | dict[str, Any] | None) -> BaseModel:
        """Parse the model's arguments (JSON text or a mapping) into the input model.

        Raises :class:`ToolArgumentsError` with a message the model can act on.
        """
        if raw is None or raw == "":
            data: Any = {}
        elif isinstance(raw, str):
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ToolArgumentsError(
                    f"the arguments are not valid JSON ({exc.msg} at position {exc.pos}); send one JSON object"
                ) from None
            except RecursionError:
                raise ToolArgumentsError(TOO_DEEP) from None
        else:
            data = raw
        if not isinstance(data, dict):
            raise ToolArgumentsError(f"the arguments must be a JSON object, not {type(data).__name__}")
        try:
            return self.input.model_validate(data)
        except ValidationError as exc:
            raise ToolArgumentsError(describe_validation_error(exc)) from None
        except RecursionError:
            raise ToolArgumentsError(TOO_DEEP) from None
        except Exception as exc:  # noqa: BLE001 - a validator of the input model raised something else
            raise ToolArgumentsError(f"invalid arguments: {describe_exception(exc, ())}") from None

    def check_output(self, value: Any) -> Any:
        """Validate ``value`` against the ``output`` model, if any. Raises ToolOutputError."""
        if self._output_adapter is None:
            return value
        try:
            return self._output_adapter.validate_python(value)
        except ValidationError as exc:
            raise ToolOutputError(
                f"tool {self.name!r} returned a result that fails its output schema: {describe_validation_error(exc)}"
            ) from None


TOO_DEEP = "the arguments are nested too deeply to read; send a flatter JSON object"


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's input schema."""


class ToolOutputError(ValueError):
    """The tool's result does not fit its declared output schema."""


def tool(
    *,
    name: str,
    description: str,
    input: type[BaseModel],
    execute: Callable[..., Any],
    runs: str = "host",
    effect: str = "unguarded",
    ends_turn: bool = False,
    output: Any = None,
    dedup_window_ms: int | None = None,
    reconcile: Reconcile | None = None,
    progress_argument: str | None = None,
    variables: Sequence[Any] = (),
    queue: str | None = None,
    concurrent: bool = False,
) -> Tool:
    """Define a tool the model can call.

    ``execute(input, ctx)`` receives the parsed input model and a
    :class:`~threads_celery.definitions.context.ToolContext`; it may be sync or async. A string result is shown
    to the model as is, anything else as JSON. ``effect`` says what a crash mid-call means; see
    :mod:`threads_celery.decisions.effects`. ``concurrent=True`` (read_only tools only, never with
    ``ends_turn``) lets the calls of one model reply run at the same time.
    """
    if not isinstance(name, str) or not TOOL_NAME.match(name) or len(name) > MAX_TOOL_NAME:
        raise ConfigError(
            f"tool name {name!r} is invalid: use lowercase letters, digits and underscores, "
            f"starting with a letter, at most {MAX_TOOL_NAME} characters"
        )
    if name in RESERVED_TOOL_NAMES:
        raise ConfigError(
            f"tool name {name!r} is reserved for the subagent lifecycle tools "
            f"({', '.join(sorted(RESERVED_TOOL_NAMES))})"
        )
    if not isinstance(description, str) or not description.strip():
        raise ConfigError(f"tool {name!r} needs a description: the model reads it to decide")
    if not (isinstance(input, type) and issubclass(input, BaseModel)):
        raise ConfigError(f"tool {name!r}: input must be a pydantic BaseModel class")
    if not callable(execute):
        raise ConfigError(f"tool {name!r}: execute must be callable as execute(input, ctx)")
    if runs == "sandbox":
        raise ConfigError(f"tool {name!r}: runs='sandbox' is not supported yet; use runs='host'")
    if runs not in get_args(Runs):
        raise ConfigError(f"tool {name!r}: runs must be 'host', not {runs!r}")
    if effect not in EFFECTS:
        raise ConfigError(f"tool {name!r}: effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    if dedup_window_ms is not None and effect != "idempotent":
        raise ConfigError(f"tool {name!r}: dedup_window_ms is only for effect='idempotent'")
    if effect == "idempotent":
        if dedup_window_ms is None:
            raise ConfigError(
                f"tool {name!r}: effect='idempotent' needs dedup_window_ms, how long the provider "
                "drops duplicates of a key"
            )
        if isinstance(dedup_window_ms, bool) or not isinstance(dedup_window_ms, int) or dedup_window_ms <= 0:
            raise ConfigError(f"tool {name!r}: dedup_window_ms must be a positive integer")
    if reconcile is not None and effect != "reconcilable":
        raise ConfigError(f"tool {name!r}: reconcile is only for effect='reconcilable'")
    if effect == "reconcilable" and not isinstance(reconcile, Reconcile):
        raise ConfigError(f"tool {name!r}: effect='reconcilable' needs reconcile=Reconcile(finality=..., lookup=...)")
    if progress_argument is not None:
        _check_progress_argument(name, input, progress_argument)
    refused = check_queue_name(f"tool {name!r}", queue)
    if refused is not None:
        raise ConfigError(refused)
    if not isinstance(concurrent, bool):
        raise ConfigError(f"tool {name!r}: concurrent must be True or False, not {concurrent!r}")
    if concurrent and effect != "read_only":
        raise ConfigError(
            f"tool {name!r}: concurrent=True is only for effect='read_only' (a {effect} call must run alone, in order)"
        )
    if concurrent and ends_turn:
        raise ConfigError(f"tool {name!r}: concurrent=True cannot be combined with ends_turn=True")
    strict_input = _forbid_unknown_keys(input)
    return Tool(
        name=name,
        description=description,
        input=strict_input,
        execute=execute,
        runs="host",
        effect=effect,
        ends_turn=bool(ends_turn),
        output=output,
        dedup_window_ms=dedup_window_ms,
        reconcile=reconcile,
        progress_argument=progress_argument,
        variables=tuple(variables),
        queue=queue,
        concurrent=concurrent,
        _output_adapter=TypeAdapter(output) if output is not None else None,
    )


def _check_progress_argument(name: str, input: type[BaseModel], argument: str) -> None:
    field_info = input.model_fields.get(argument)
    if field_info is None:
        raise ConfigError(f"tool {name!r}: progress_argument {argument!r} is not a field of {input.__name__}")
    if field_info.annotation is not str:
        raise ConfigError(
            f"tool {name!r}: progress_argument {argument!r} must be a str field, not {field_info.annotation!r}"
        )


def _forbid_unknown_keys(input: type[BaseModel]) -> type[BaseModel]:
    """A subclass of ``input`` that rejects keys it does not declare."""
    if input.model_config.get("extra") == "forbid":
        return input
    return type(
        input.__name__,
        (input,),
        {
            "model_config": {**input.model_config, "extra": "forbid"},
            "__module__": input.__module__,
            "__doc__": input.__doc__,
        },
    )


def render_result(value: Any) -> str:
    """What the model sees for a tool's result: a string as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    # JSON text is UTF-8: a lone surrogate in a string cannot be encoded, so it is replaced
    # first, by the ledger's own rule (see threads_celery.records.storable). NaN and the
    # infinities have no JSON form: null, as Pydantic (and so Pydantic AI) renders them, keeps
    # the text JSON that any reader can parse.
    return pydantic_core.to_json(storable(value), inf_nan_mode="null").decode()


#: The metadata of a tool return part whose text is the JSON of the value the tool returned.
RETURNED_JSON = {"threads_celery": "returned_json"}


class ToolContent(str):
    """A tool's result that holds files (images, audio, documents) beside text: Pydantic AI's
    tool-return content as its JSON (each file with its bytes in base64), which the model is
    given as those parts (``BinaryContent`` for a file), not as text. Build it with :meth:`of`.
    """

    __slots__ = ()

    @classmethod
    def of(cls, value: Any) -> ToolContent:
        """The content ``value`` (a string, a ``BinaryContent``, JSON data, or a list of them)."""
        from pydantic_ai.messages import tool_return_content_ta  # only for tools that return files

        return cls(tool_return_content_ta.dump_json(value).decode())

    @staticmethod
    def parts(text: str) -> Any:
        """The content a stored result's ``text`` holds, files as ``BinaryContent`` again."""
        from pydantic_ai.messages import tool_return_content_ta

        return tool_return_content_ta.validate_json(text)


def result_kind(value: Any) -> str | None:
    """The ``kind`` of a tool's result (see :class:`~threads_celery.records.ToolResult`): None for
    text, ``"content"`` for :class:`ToolContent`, ``"json"`` for any other value."""
    if isinstance(value, ToolContent):
        return "content"
    return None if isinstance(value, str) else "json"


def shorten_for_model(content: str, max_bytes: int) -> str | None:
    """``content`` cut to ``max_bytes`` of UTF-8 with a note saying so; None when it fits."""
    encoded = content.encode("utf-8", errors="surrogatepass")
    if len(encoded) <= max_bytes:
        return None
    head = encoded[:max_bytes].decode("utf-8", errors="ignore")  # never half a character
    return (
        f"{head}\n\n[result shortened: it is {len(encoded)} bytes, over the limit of {max_bytes}; "
        f"only the first {len(head.encode('utf-8', errors='surrogatepass'))} bytes are shown. The whole result is kept for the user.]"
    )


def describe_validation_error(exc: ValidationError) -> str:
    """A compact, model-readable account of what failed validation (no input values echoed)."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        problems.append(f"{where}: {error['msg']}")
    return "invalid arguments: " + "; ".join(problems)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
