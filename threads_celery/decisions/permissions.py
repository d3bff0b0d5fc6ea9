"""Permissions: whether a tool call is allowed, asked or denied. Pure decisions.

Rules are evaluated in a fixed order: deny rules, then ask rules, then allow rules, then
remembered decisions ("always allow this tool on this thread", given with an approval), then
the mode. An ``Ask`` is answered by a person's approval, which is bound to the exact arguments
it was given for: edited arguments need their own approval.

Modes (what happens to a call that no rule and no remembered decision settles):
- ``default``: read_only tools run freely; every other tool asks first.
- ``accept_edits``: read_only tools and the changes that are safe to repeat or can be checked
  (``idempotent`` and ``reconcilable`` effects: the "edits") run freely; ``unguarded`` tools,
  whose effect can be neither deduplicated nor looked up, ask first, and so does a destructive
  tool whatever its effect (an MCP tool's ``destructiveHint``: repeating it is harmless, doing it
  once is not).
- ``plan``: only read_only tools run; every other call is denied, so the model can look
  around and propose what it would do, but changes nothing.
- ``dont_ask``: read_only tools run freely; what would ask is denied instead (unattended runs).
- ``bypass``: everything runs without asking. Only with ``enable_bypass=True``, so that it is
  never switched on by accident.

The ceiling: a call of a child run (an agent tool, a subagent, a detached child) is decided by
its own agent's permissions and by each ancestor's, for the same tool and effect, and the
strictest answer wins (deny over ask over allow): a child is capped by its parent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, assert_never, get_args

from threads_celery.exceptions import ConfigError

Mode = Literal["default", "accept_edits", "plan", "dont_ask", "bypass"]
#: Effects that ``accept_edits`` lets run without asking (besides read_only).
EDIT_EFFECTS = frozenset({"idempotent", "reconcilable"})


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
    tool: str,
    effect: str,
    permissions: Permissions | None,
    *,
    approved_for_these_args: bool = False,
    remembered: bool = False,
    destructive: bool = False,
) -> PermissionDecision:
    """Allowed, asked or denied, for one call of ``tool`` whose effect is ``effect``.

    ``remembered``: a person chose "always allow this tool on this thread". ``destructive``: the
    tool says it may destroy or overwrite (``accept_edits`` asks first).
    """
    rules = permissions or Permissions()
    decision = _by_rules(tool, effect, rules, remembered=remembered, destructive=destructive)
    if isinstance(decision, Ask) and approved_for_these_args:
        return Allow("approved by a person for these arguments")
    return decision


def may_be_remembered(tool: str, effect: str, permissions: Permissions | None, *, destructive: bool = False) -> bool:
    """Whether a remembered decision could change the answer (so the store is worth asking)."""
    rules = permissions or Permissions()
    if tool in rules.deny or tool in rules.ask or tool in rules.allow:
        return False
    return not isinstance(_by_mode(tool, effect, rules, destructive), Allow)


@dataclass(frozen=True, slots=True)
class Layer:
    """One level of the ceiling: an agent's permissions, and whether a person remembered
    "always allow" for the tool on that level's thread (or on the calling thread)."""

    permissions: Permissions | None
    remembered: bool = False


def decide_with_ceiling(
    tool: str,
    effect: str,
    layers: Sequence[Layer],
    *,
    approved_for_these_args: bool = False,
    destructive: bool = False,
) -> PermissionDecision:
    """The call's answer under the ceiling: the strictest of every layer's answer.

    ``layers[0]`` is the calling agent's own; the rest are its ancestors'. A person's approval
    of these exact arguments answers an Ask; it never lifts a Deny.
    """
    if not layers:
        layers = [Layer(None)]
    answers = [
        decide_permission(tool, effect, layer.permissions, remembered=layer.remembered, destructive=destructive)
        for layer in layers
    ]
    decision = strictest(answers)
    if isinstance(decision, Ask) and approved_for_these_args:
        return Allow("approved by a person for these arguments")
    if isinstance(decision, (Ask, Deny)) and decision is not answers[0] and len(layers) > 1:
        return type(decision)(f"{decision.reason} (a parent's permissions cap this child's)")
    return decision


_STRICTNESS = {Allow: 0, Ask: 1, Deny: 2}


def strictest(answers: Sequence[PermissionDecision]) -> PermissionDecision:
    """The strictest answer (deny over ask over allow); the first of equals. Needs one answer."""
    if not answers:
        raise ValueError("strictest() needs at least one answer")
    best = answers[0]
    for answer in answers[1:]:
        if _STRICTNESS[type(answer)] > _STRICTNESS[type(best)]:
            best = answer
    return best


def _by_rules(
    tool: str, effect: str, rules: Permissions, *, remembered: bool = False, destructive: bool = False
) -> PermissionDecision:
    if tool in rules.deny:
        return Deny(f"tool {tool!r} is denied by the agent's permission rules")
    if tool in rules.ask:
        return Ask(f"tool {tool!r} asks for approval by rule")
    if tool in rules.allow:
        return Allow(f"tool {tool!r} is allowed by rule")
    if remembered:
        return Allow(f"tool {tool!r} is always allowed on this thread (a person's remembered decision)")
    return _by_mode(tool, effect, rules, destructive)


def _by_mode(tool: str, effect: str, rules: Permissions, destructive: bool = False) -> PermissionDecision:
    if rules.mode == "bypass":
        return Allow("bypass mode")
    if effect == "read_only":
        return Allow("read_only tools run freely")
    if rules.mode == "default":
        return Ask(f"{effect} tool {tool!r} asks for approval first")
    if rules.mode == "accept_edits":
        if effect in EDIT_EFFECTS and destructive:
            return Ask(f"{effect} tool {tool!r} is destructive, so it asks for approval first (accept_edits)")
        if effect in EDIT_EFFECTS:
            return Allow(f"accept_edits mode: {effect} tools run without asking")
        return Ask(
            f"{effect} tool {tool!r} asks for approval first (accept_edits accepts only idempotent and reconcilable tools)"
        )
    if rules.mode == "plan":
        return Deny(f"plan mode: only read_only tools run, and {tool!r} is {effect}; describe the change instead")
    if rules.mode == "dont_ask":
        return Deny(f"{effect} tool {tool!r} needs approval, and this agent does not ask")
    assert_never(rules.mode)
