"""What a Pydantic AI agent's capabilities add, carried over: model settings, instructions, tools.

Part of :func:`~threads_celery.definitions.pydantic_ai_adapter.from_pydantic_ai`. A capability
that only adds model settings (``Caching``), instructions or plain function tools carries over;
one that hooks into runs, model requests or tool calls, wraps the model or adds native tools is a
ConfigError naming it and what it does, never a silent difference.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from pydantic_ai import Agent as PydanticAgent

from threads_celery.exceptions import ConfigError

#: What a capability may do and still carry over: add model settings, instructions and tools.
_CARRIED_HOOKS = frozenset({"get_model_settings", "get_instructions", "get_toolset", "get_ordering", "get_description"})


@dataclasses.dataclass(frozen=True)
class Carried:
    """What an agent's capabilities add: model settings, instruction parts and function tools."""

    settings: dict[str, Any]
    instructions: list[str | Callable[..., Any]]
    tools: dict[str, Any]


def carried_capabilities(agent: Any, owner: str) -> Carried:
    """Carry over the model settings, instructions and tools the agent's capabilities add (``Caching``
    adds a setting); a capability that does anything else (hooks around runs, requests or tools,
    wrapped models, native tools) is a ConfigError naming it and what it does."""
    from pydantic_ai.capabilities.abstract import AbstractCapability, leaf_capabilities
    from pydantic_ai.toolsets import FunctionToolset

    defaults = _default_capability_types()
    carried = Carried({}, [], {})
    for capability in leaf_capabilities(agent._root_capability):
        kind = type(capability)
        if kind in defaults:
            continue
        name = kind.__name__
        overridden = sorted(
            attr
            for attr, member in vars(AbstractCapability).items()
            if not attr.startswith("_") and callable(member) and getattr(kind, attr, member) is not member
        )
        refused = [attr for attr in overridden if attr not in _CARRIED_HOOKS]
        if refused:
            raise ConfigError(
                f"{owner}: capability {name} uses {', '.join(refused)}, which does not carry over; "
                "capabilities that add model settings, instructions or plain function tools do"
            )
        settings = capability.get_model_settings()
        if callable(settings):
            raise ConfigError(f"{owner}: capability {name} computes model settings per run, which does not carry over")
        carried.settings.update(dict(settings or {}))
        instructions: Any = capability.get_instructions()
        parts = [instructions] if isinstance(instructions, str) or callable(instructions) else list(instructions or [])
        for part in parts:
            if not (isinstance(part, str) or callable(part)):
                raise ConfigError(
                    f"{owner}: capability {name} gives a {type(part).__name__} as instructions, which does not "
                    "carry over; give text or a function"
                )
            carried.instructions.append(part)
        toolset = capability.get_toolset()
        if toolset is not None and type(toolset) is not FunctionToolset:
            raise ConfigError(f"{owner}: capability {name} adds a {type(toolset).__name__}, which does not carry over")
        if toolset is not None:
            carried.tools.update(toolset.tools)
    return carried


@functools.cache
def _default_capability_types() -> frozenset[type]:
    """The capabilities every Pydantic AI agent has without being given any."""
    from pydantic_ai.capabilities.abstract import leaf_capabilities
    from pydantic_ai.models.test import TestModel

    return frozenset(type(c) for c in leaf_capabilities(PydanticAgent(TestModel())._root_capability))


__all__ = ["Carried", "carried_capabilities"]
