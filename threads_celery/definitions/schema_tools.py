"""Tools described by a JSON schema rather than a pydantic model: MCP tools and Pydantic AI tools.

A :class:`SchemaTool` is a :class:`~threads_celery.definitions.tools.Tool` whose argument schema comes from
elsewhere (an MCP server's ``inputSchema``, a Pydantic AI tool's function schema) and whose
arguments are checked by a validator that goes with that schema. Everything else (effect, effect
key, permission check, dispatch as a ``threads.tool`` task, recovery) is the same as for any tool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from threads_celery.decisions.effects import EFFECTS, Reconcile
from threads_celery.definitions.tools import Tool
from threads_celery.exceptions import ConfigError

#: Validates decoded arguments and returns the values ``execute`` receives; raises
#: :class:`~threads_celery.definitions.tools.ToolArgumentsError` with a message the model can act on.
ArgumentsValidator = Callable[[dict[str, Any]], dict[str, Any]]


class RawArguments(BaseModel):
    """Any JSON object: the decoding step before a schema tool's own validator runs."""

    model_config = ConfigDict(extra="allow")


class ToolArguments(BaseModel):
    """What a schema tool's ``execute`` receives: the validated argument values."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SchemaTool(Tool):
    """A tool whose arguments are described by ``json_schema`` and checked by ``validate``.

    ``execute(arguments, ctx)`` receives a :class:`ToolArguments`. Build one with
    :func:`schema_tool`.
    """

    json_schema: dict[str, Any] = field(default_factory=dict)
    validate: ArgumentsValidator | None = field(default=None, repr=False, compare=False)

    def parameters_json_schema(self) -> dict[str, Any]:
        """The JSON schema the model sees for this tool's arguments."""
        return self.json_schema

    def arguments_of(self, parsed: BaseModel) -> dict[str, Any]:
        """The argument values themselves, not the :class:`ToolArguments` that carries them."""
        if isinstance(parsed, ToolArguments):
            return dict(parsed.values)
        return Tool.arguments_of(self, parsed)

    def parse_arguments(self, raw: str | dict[str, Any] | None) -> BaseModel:
        """Decode the model's arguments as any tool does, then check them with ``validate``."""
        # Explicit base call: zero-argument super() does not work in a slots dataclass.
        decoded = Tool.parse_arguments(self, raw)
        values = dict(decoded.model_extra or {})
        if self.validate is not None:
            values = self.validate(values)
        return ToolArguments.model_construct(values=values)


def schema_tool(
    *,
    name: str,
    description: str,
    json_schema: Mapping[str, Any],
    validate: ArgumentsValidator | None,
    execute: Callable[..., Any],
    effect: str,
    dedup_window_ms: int | None = None,
    reconcile: Reconcile | None = None,
    queue: str | None = None,
    destructive: bool = False,
) -> SchemaTool:
    """A :class:`SchemaTool`, with the effect rules of :func:`~threads_celery.definitions.tools.tool`."""
    if effect not in EFFECTS:
        raise ConfigError(f"tool {name!r}: effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    if effect == "idempotent" and (
        isinstance(dedup_window_ms, bool) or not isinstance(dedup_window_ms, int) or dedup_window_ms <= 0
    ):
        raise ConfigError(
            f"tool {name!r}: effect='idempotent' needs dedup_window_ms, a positive number of "
            "milliseconds during which a repeated call is harmless"
        )
    if effect == "reconcilable" and not isinstance(reconcile, Reconcile):
        raise ConfigError(f"tool {name!r}: effect='reconcilable' needs a Reconcile(finality=..., lookup=...)")
    if not description.strip():
        description = f"The {name} tool."
    return SchemaTool(
        name=name,
        description=description,
        input=RawArguments,
        execute=execute,
        effect=effect,
        dedup_window_ms=dedup_window_ms if effect == "idempotent" else None,
        reconcile=reconcile if effect == "reconcilable" else None,
        queue=queue,
        json_schema=dict(json_schema),
        validate=validate,
        destructive=destructive and effect != "read_only",
    )


EffectChoice = str | Reconcile
"""What an author states for a tool's effect: an effect name, or a Reconcile for reconcilable."""


def stated_effect(
    owner: str,
    tool_name: str,
    choice: EffectChoice,
    dedup_window_ms: int | Mapping[str, int] | None,
) -> tuple[str, int | None, Reconcile | None]:
    """The (effect, dedup window, reconcile) an author's ``effects={...}`` entry stands for.

    Pure. A :class:`Reconcile` means ``reconcilable``; ``"idempotent"`` takes its window from
    ``dedup_window_ms`` (one number for every tool, or a mapping by tool name) and is a
    ConfigError without one.
    """
    if isinstance(choice, Reconcile):
        return "reconcilable", None, choice
    if choice not in EFFECTS:
        raise ConfigError(
            f"{owner}: the effect of {tool_name!r} must be one of {', '.join(EFFECTS)} or a Reconcile, not {choice!r}"
        )
    if choice == "reconcilable":
        raise ConfigError(f"{owner}: state {tool_name!r} as reconcilable with a Reconcile(finality=..., lookup=...)")
    if choice != "idempotent":
        return choice, None, None
    window = dedup_window_ms.get(tool_name) if isinstance(dedup_window_ms, Mapping) else dedup_window_ms
    if window is None:
        raise ConfigError(
            f"{owner}: {tool_name!r} is idempotent but no dedup_window_ms says for how long a repeated "
            "call is harmless; set dedup_window_ms (a number of milliseconds, or a mapping by tool name)"
        )
    return "idempotent", window, None
