"""Running an agent's hooks: each call on a thread of its own, cut off at the agent's limit.

The hook points and the answers a hook may give are declared in
:mod:`threads_celery.definitions.hooks`, with :func:`~threads_celery.definitions.hooks.combine`,
the pure verdict of a chain of deciding hooks. Here is the shell the step machine calls:
:func:`call_with_limit` runs one hook on a thread of its own and waits at most the agent's
``hook_timeout_s`` (a hung hook's thread is abandoned, as Python cannot stop it); :func:`gate_call`,
:func:`step_instructions`, :func:`observe_result` and :func:`observe_stop` apply each kind of hook
at its point of a run.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from threads_celery.definitions.agents import Agent
from threads_celery.definitions.hooks import (
    DEFAULT_HOOK_TIMEOUT_S,
    Deny,
    Failed,
    HookAnswer,
    HookCall,
    HookContext,
    HookResult,
    Modify,
    Outcome,
    Stop,
    Verdict,
    check_answer,
    combine,
)
from threads_celery.definitions.tools import Tool, ToolArgumentsError, render_result
from threads_celery.records import CallRow, Run
from threads_celery.redaction import known_secrets
from threads_celery.runtime import tool_faults
from threads_celery.runtime.models import run_coroutine
from threads_celery.store import Store
from threads_celery.store.repository import args_digest

log = logging.getLogger("threads_celery.runtime.hooks")


def implementers(agent: Agent, point: str) -> list[Callable[..., Any]]:
    """The callables for hook point ``point``: the agent's own override, then its hooks objects'."""
    found: list[Callable[..., Any]] = []
    own = getattr(type(agent), point, None)
    if own is not None and own is not getattr(Agent, point, None):
        found.append(getattr(agent, point))
    for extra in getattr(agent, "hooks", ()) or ():
        method = getattr(extra, point, None)
        if callable(method):
            found.append(method)
    return found


def call_with_limit(hook: str, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float) -> Outcome:
    """Run ``fn(*args)`` on a thread of its own; a failure or a run past ``timeout_s`` is Failed."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            value = fn(*args)
            if inspect.iscoroutine(value):
                value = run_coroutine(value)
            box["value"] = value
        except BaseException as exc:  # noqa: BLE001 - any failure of user code is the hook's failure
            box["error"] = exc

    worker = threading.Thread(target=target, name=f"hook-{hook}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return ("failed", Failed(hook, f"timed out after {timeout_s:g} s"))
    if "error" in box:
        exc = box["error"]
        # Never raises (a hostile __str__ is named, not run to a crash) and is redacted of the
        # secrets revealed in this process.
        return ("failed", Failed(hook, tool_faults.describe(exc, known_secrets())))
    return ("ok", box.get("value"))


def decide(agent: Agent, point: str, call: HookCall, ctx: HookContext) -> Verdict | None:
    """Run the deciding hooks of ``point`` in order; None when the agent has none."""
    fns = implementers(agent, point)
    if not fns:
        return None
    answers: list[HookAnswer | Failed | None] = []
    current = call
    for fn in fns:
        status, value = call_with_limit(point, fn, (current, ctx), timeout_of(agent))
        answer = value if status == "failed" else check_answer(point, value)
        answers.append(answer)
        if isinstance(answer, (Failed, Deny)):
            break  # the first deny stops the chain
        if isinstance(answer, Modify):
            current = HookCall(call.name, dict(answer.args), call.effect_key, call.call_id, call.effect)
    verdict = combine(call.args, answers)
    if not verdict.allowed:
        log.info(
            "call %s (%s) denied by a %s hook: %s",
            call.effect_key,
            call.name,
            point,
            verdict.reason,
        )
    return verdict


def add_context(agent: Agent, ctx: HookContext) -> tuple[str, Failed | None]:
    """Run the ``before_step`` hooks; the text they add, or the first failure (stops the step)."""
    parts: list[str] = []
    for fn in implementers(agent, "before_step"):
        status, value = call_with_limit("before_step", fn, (ctx,), timeout_of(agent))
        if status == "failed":
            return "", value
        if value is None:
            continue
        if not isinstance(value, str):
            return "", Failed("before_step", f"a context hook returns text or None, not {type(value).__name__}")
        if value:
            parts.append(value)
    return "\n\n".join(parts), None


def observe(agent: Agent, point: str, args: Sequence[Any]) -> None:
    """Run the observing hooks of ``point``; a failure is logged and ignored."""
    for fn in implementers(agent, point):
        status, value = call_with_limit(point, fn, args, timeout_of(agent))
        if status == "failed":
            log.warning("observing hook %s failed and was ignored: %s", point, value.reason)


@dataclass(frozen=True, slots=True)
class Gated:
    """A call the deciding hooks let through: its (possibly changed) row and parsed input."""

    call: CallRow
    parsed: BaseModel
    hook_call: HookCall | None
    ctx: HookContext | None


@dataclass(frozen=True, slots=True)
class Refused:
    """A call the deciding hooks stopped: what the model is shown as the call's error."""

    content: str


def gate_call(store: Store, run: Run, call: CallRow, agent: Agent, tool: Tool, parsed: BaseModel) -> Gated | Refused:
    """Run ``before_tool`` (and ``before_subagent`` for a child call) on a call about to run.

    Returns the call to run, or why it may not run, for its error result: a denied call shows
    the model ``denied: <reason>``; changed arguments that fail validation are the call's error.
    Changed arguments that pass are recorded on the call (the original kept).
    """
    points = ["before_tool"]
    if tool.child_agent is not None or tool.subagent_op in ("create", "message"):
        points.append("before_subagent")
    wanted = [p for p in points if implementers(agent, p)]
    observed = bool(implementers(agent, "after_tool"))
    if not wanted and not observed:
        return Gated(call, parsed, None, None)
    ctx = HookContext(run_id=run.id, thread_id=run.thread_id, agent=agent.name, step=call.step, deps=agent.deps)
    hook_call = HookCall(tool.name, tool.arguments_of(parsed), call.effect_key, call.call_id, tool.effect)
    for point in wanted:
        verdict = decide(agent, point, hook_call, ctx)
        assert verdict is not None
        if not verdict.allowed:
            return Refused(f"denied: {verdict.reason}")
        if verdict.changed and verdict.args is not None:
            try:
                parsed = tool.parse_arguments(dict(verdict.args))
            except ToolArgumentsError as exc:
                return Refused(f"a {point} hook changed the arguments to ones that fail validation: {exc}")
            hook_call = HookCall(tool.name, tool.arguments_of(parsed), call.effect_key, call.call_id, tool.effect)
    new_args = render_result(hook_call.args)
    if new_args != call.args and _json(call.args) != hook_call.args:
        with store.transaction() as tx:
            tx.update_call(
                call.effect_key,
                args=new_args,
                args_hash=args_digest(new_args),
                original_args=call.original_args or call.args,
            )
        log.info("call %s (%s): arguments changed by a hook", call.effect_key, tool.name)
        call = replace(call, args=new_args, original_args=call.original_args or call.args)
    return Gated(call, parsed, hook_call, ctx)


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return None


def step_instructions(run: Run, step: int, agent: Agent) -> str | Failed:
    """The step's instructions with what ``before_step`` hooks add, or the first one's failure:
    a context hook's failure stops the step (see :func:`stopped_by`)."""
    if not implementers(agent, "before_step"):
        return str(agent.system_prompt())
    ctx = HookContext(run_id=run.id, thread_id=run.thread_id, agent=agent.name, step=step, deps=agent.deps)
    added, failed = add_context(agent, ctx)
    if failed is not None:
        return failed
    return "\n\n".join(part for part in (agent.system_prompt(), added) if part)


def stopped_by(failed: Failed) -> str:
    """The error a run ends with when a ``before_step`` hook failed."""
    return f"hook {failed.hook} failed ({failed.reason}), so the step was stopped"


def observe_result(agent: Agent, gated: Gated, content: str, is_error: bool) -> None:
    """``after_tool``, once the call's result is recorded."""
    if gated.hook_call is not None and gated.ctx is not None:
        observe(agent, "after_tool", (gated.hook_call, HookResult(content, is_error), gated.ctx))


def observe_stop(agent: Agent, run: Run, step: int, stop: Stop) -> None:
    """``on_stop``, once the run's end is recorded."""
    if implementers(agent, "on_stop"):
        ctx = HookContext(run_id=run.id, thread_id=run.thread_id, agent=agent.name, step=step, deps=agent.deps)
        observe(agent, "on_stop", (stop, ctx))


def timeout_of(agent: Agent) -> float:
    value = getattr(agent, "hook_timeout_s", DEFAULT_HOOK_TIMEOUT_S)
    return float(value)
