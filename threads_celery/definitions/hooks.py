"""Hooks: an agent's own code at fixed points of a run, each cut off at a time limit.

Hook points are methods of an :class:`~threads_celery.definitions.agents.Agent` subclass, or of any object
in ``Agent(hooks=[...])`` (the agent's own methods come first, then the objects in order):

=================================  ============  ===============================================
method                             kind          what it may do
=================================  ============  ===============================================
``before_tool(call, ctx)``         deciding      ``Allow()``, ``Deny(reason)``, ``Modify(args)``
``before_subagent(call, ctx)``     deciding      the same, for a call that starts a child run
``before_step(ctx)``               context       return text added to this step's instructions
``after_tool(call, result, ctx)``  observing     see the result the model will be shown
``after_subagent(run, result)``    observing     see a child run's result as it is delivered
``on_stop(stop, ctx)``             observing     see the run end (status, output, error)
=================================  ============  ===============================================

Each call is limited to the agent's ``hook_timeout_s`` (5 s by default); a hook that raises or
runs past it is treated by its kind: a deciding hook fails closed (the call is denied), a
context hook stops the step (the run ends in error, saying why), an observing hook's failure is
logged and ignored. Among several deciding hooks the strictest answer wins: the first
``Deny`` stops the chain, and a ``Modify`` hands its arguments to the hooks after it. A hook's
``Allow`` never loosens the agent's permissions: the stricter of the two answers wins. Changed
arguments are validated again and recorded on the call; a denied call shows the model
``denied: <reason>``.

:func:`combine` (the chain's verdict) is pure. Running the hooks at their points of a run, each
cut off at its limit, is the runtime's part: :mod:`threads_celery.runtime.hooks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_HOOK_TIMEOUT_S = 5.0

DECIDING = ("before_tool", "before_subagent")
CONTEXT = ("before_step",)
OBSERVING = ("after_tool", "after_subagent", "on_stop")
HOOK_POINTS: tuple[str, ...] = (*DECIDING, *CONTEXT, *OBSERVING)


@dataclass(frozen=True, slots=True)
class Allow:
    """A deciding hook's answer: the call may go on (the agent's permissions still apply)."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class Deny:
    """A deciding hook's answer: the call does not run; the model sees ``denied: <reason>``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Modify:
    """A deciding hook's answer: run the call with these arguments instead (validated again)."""

    args: Mapping[str, Any]


HookAnswer = Allow | Deny | Modify


@dataclass(frozen=True, slots=True)
class HookCall:
    """The call a tool hook sees: the tool's name and the arguments as parsed JSON."""

    name: str
    args: Mapping[str, Any]
    effect_key: str
    call_id: str
    effect: str


@dataclass(frozen=True, slots=True)
class HookResult:
    """What ``after_tool`` sees: the text the model will be shown, and whether it is an error."""

    content: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class Stop:
    """What ``on_stop`` sees: how the run ended."""

    status: str
    output: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class HookContext:
    """Where a hook runs: the run, its thread, the agent and step, and the agent's deps."""

    run_id: str
    thread_id: str
    agent: str
    step: int
    deps: Any = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The chain's verdict for one call: denied (with a reason), or allowed with these args."""

    allowed: bool
    reason: str = ""
    args: Mapping[str, Any] | None = None
    changed: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    """A hook raised, ran past its limit, or answered with something it may not."""

    hook: str
    reason: str


Outcome = tuple[Literal["ok"], Any] | tuple[Literal["failed"], Failed]


def combine(args: Mapping[str, Any], answers: Sequence[HookAnswer | Failed | None]) -> Verdict:
    """The verdict of a chain of deciding hooks, given each one's answer in order.

    Pure. ``None`` (the hook returned nothing) counts as Allow. A failure fails closed.
    """
    current, changed = dict(args), False
    for answer in answers:
        if isinstance(answer, Failed):
            return Verdict(False, f"hook {answer.hook} failed ({answer.reason}), so the call is denied")
        if isinstance(answer, Deny):
            return Verdict(False, answer.reason or "denied by a hook")
        if isinstance(answer, Modify):
            current, changed = dict(answer.args), True
    return Verdict(True, args=current, changed=changed)


def check_answer(hook: str, value: Any) -> HookAnswer | Failed | None:
    """A deciding hook's return value as an answer; anything else is a failure (fail closed)."""
    if value is None or isinstance(value, (Allow, Deny)):
        return value
    if isinstance(value, Modify):
        if not isinstance(value.args, Mapping):
            return Failed(hook, f"Modify(args) needs a mapping of arguments, not {type(value.args).__name__}")
        return value
    return Failed(
        hook,
        f"a deciding hook returns Allow(), Deny(reason) or Modify(args), not {type(value).__name__}",
    )


__all__ = ["Allow", "Deny", "HookCall", "HookContext", "HookResult", "Modify", "Stop"]
