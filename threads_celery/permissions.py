"""Permissions: whether a tool call is allowed, asked or denied. Pure decisions.

Rules are evaluated in a fixed order: deny rules, then ask rules, then allow rules, then the
mode. An ``Ask`` is answered by a person's approval, which is bound to the exact arguments it
was given for: edited arguments need their own approval.

Modes:
- ``default``: read_only tools run freely; every other tool asks first.
- ``dont_ask``: read_only tools run freely; what would ask is denied instead (unattended runs).
- ``bypass``: everything runs without asking. Only with ``enable_bypass=True``, so that it is
  never switched on by accident.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, assert_never, get_args

from .exceptions import ConfigError

Mode = Literal["default", "dont_ask", "bypass"]


@dataclass(frozen=True, slots=True)
class Permissions:
    """An agent's permission rules: tool names to allow, ask or deny, and a mode."""

    mode: Mode = "default"
    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    enable_bypass: bool = False

    def __init__(
        self,
        mode: Mode = "default",
        *,
        allow: Iterable[str] = (),
        ask: Iterable[str] = (),
        deny: Iterable[str] = (),
        enable_bypass: bool = False,
    ) -> None:
        if mode not in get_args(Mode):
            raise ConfigError(f"permission mode must be one of {', '.join(get_args(Mode))}, not {mode!r}")
        if mode == "bypass" and not enable_bypass:
            raise ConfigError("permission mode 'bypass' must be enabled explicitly (enable_bypass=True)")
        for rules in (allow, ask, deny):
            if isinstance(rules, str):
                raise ConfigError("permission rules are lists of tool names, not a string")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "allow", tuple(allow))
        object.__setattr__(self, "ask", tuple(ask))
        object.__setattr__(self, "deny", tuple(deny))
        object.__setattr__(self, "enable_bypass", enable_bypass)

    @classmethod
    def allow_all(cls) -> Permissions:
        """Run every tool without asking (bypass, enabled explicitly)."""
        return cls("bypass", enable_bypass=True)


@dataclass(frozen=True, slots=True)
class Allow:
    reason: str


@dataclass(frozen=True, slots=True)
class Ask:
    reason: str


@dataclass(frozen=True, slots=True)
class Deny:
    reason: str


PermissionDecision = Allow | Ask | Deny


def decide_permission(
    tool: str, effect: str, permissions: Permissions | None, *, approved_for_these_args: bool = False
) -> PermissionDecision:
    """Allowed, asked or denied, for one call of ``tool`` whose effect is ``effect``."""
    rules = permissions or Permissions()
    decision = _by_rules(tool, effect, rules)
    if isinstance(decision, Ask) and approved_for_these_args:
        return Allow("approved by a person for these arguments")
    return decision


def _by_rules(tool: str, effect: str, rules: Permissions) -> PermissionDecision:
    if tool in rules.deny:
        return Deny(f"tool {tool!r} is denied by the agent's permission rules")
    if tool in rules.ask:
        return Ask(f"tool {tool!r} asks for approval by rule")
    if tool in rules.allow:
        return Allow(f"tool {tool!r} is allowed by rule")
    if rules.mode == "bypass":
        return Allow("bypass mode")
    if effect == "read_only":
        return Allow("read_only tools run freely")
    if rules.mode == "default":
        return Ask(f"{effect} tool {tool!r} asks for approval first")
    if rules.mode == "dont_ask":
        return Deny(f"{effect} tool {tool!r} needs approval, and this agent does not ask")
    assert_never(rules.mode)
