"""The shell around :mod:`threads_celery.decisions.permissions`: load what a call's answer depends on.

A root run's call needs nothing from the store unless a remembered decision could change its
answer. A child run's call (agent tool, subagent, detached child) is decided under the ceiling:
its own agent's permissions and every ancestor's, each with the "always allow" decisions
remembered on its thread (a decision remembered on the calling thread counts at every level: a
person who said "always allow this tool here" answered the ask, whichever level asked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from threads_celery.decisions.branches import prior_effect_reason
from threads_celery.decisions.permissions import (
    Allow,
    Ask,
    Layer,
    PermissionDecision,
    Permissions,
    decide_permission,
    decide_with_ceiling,
    may_be_remembered,
)
from threads_celery.records import CallRow, PriorEffect, Run
from threads_celery.store.repository import args_digest
from threads_celery.transitions.branches import PRIOR_EFFECTS_KEY

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent, AgentRegistry
    from threads_celery.definitions.tools import Tool
    from threads_celery.store import Store


def check_call(
    store: Store,
    registry: AgentRegistry,
    run: Run,
    agent: Agent,
    tool: Tool,
    call: CallRow | None = None,
) -> PermissionDecision:
    """Allowed, asked or denied: the call's answer (with ``call``, its approval counts)."""
    approved = (
        call is not None
        and call.approved_args_hash is not None  # never approved: no digest to take
        and call.approved_args_hash == args_digest(call.args)
    )
    decision = _decide(store, registry, run, agent, tool, approved)
    prior = (run.input_meta or {}).get(PRIOR_EFFECTS_KEY)
    if prior and not approved and isinstance(decision, Allow):
        # A branch does not undo what the history it left behind did: a repeat asks first.
        reason = prior_effect_reason(tool.name, [PriorEffect.from_json(p) for p in prior])
        if reason is not None:
            return Ask(reason)
    return decision


def _decide(
    store: Store, registry: AgentRegistry, run: Run, agent: Agent, tool: Tool, approved: bool
) -> PermissionDecision:
    own: Permissions | None = agent.permissions
    destructive = tool.destructive
    if run.agent_tool_run_id is None and not may_be_remembered(tool.name, tool.effect, own, destructive=destructive):
        return decide_permission(tool.name, tool.effect, own, approved_for_these_args=approved, destructive=destructive)
    with store.read() as tx:
        chain = tx.thread_chain(run.thread_id) if run.agent_tool_run_id is not None else [(run.thread_id, run.agent)]
        levels = [(thread_id, _permissions_of(registry, name)) for thread_id, name in chain]
        levels[0] = (levels[0][0], own)  # the calling agent as this worker defines it
        wanted = any(may_be_remembered(tool.name, tool.effect, p, destructive=destructive) for _, p in levels)
        granted = tx.granted_threads([t for t, _ in levels], tool.name) if wanted else set()
    here = run.thread_id in granted
    layers = [Layer(p, remembered=here or thread_id in granted) for thread_id, p in levels]
    return decide_with_ceiling(
        tool.name, tool.effect, layers, approved_for_these_args=approved, destructive=destructive
    )


def _permissions_of(registry: AgentRegistry, name: str) -> Permissions | None:
    # An ancestor this worker does not know is taken at the default (asks before any effect):
    # the ceiling must never be lifted by a missing definition.
    if name not in registry:
        return Permissions()
    permissions = registry.get(name).permissions
    return permissions if isinstance(permissions, Permissions) else Permissions()
