"""What a person does to a run that waits for them: approve or deny a call, settle a parked one.

Each function is one transaction over the ledger; it checks the call is in the state the action
expects and changes nothing otherwise.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Literal

from threads_celery.definitions.agents import AgentRegistry
from threads_celery.definitions.tools import ToolArgumentsError, render_result
from threads_celery.exceptions import CallNotFound, CallStateError, FenceLost, InvalidArguments
from threads_celery.records import CallRow, OutboxEntry, Run
from threads_celery.store import Tx
from threads_celery.store.repository import args_digest
from threads_celery.transitions import runs
from threads_celery.transitions.pending import announce_answer

log = logging.getLogger("threads_celery.transitions.interventions")

Resolution = Literal["assume_done", "assume_not_done"]


def _load(tx: Tx, effect_key: str, expected: str) -> tuple[CallRow, Run]:
    loaded = tx.get_call_and_run(effect_key, lock=True)
    if loaded is None:
        raise CallNotFound(effect_key)
    call, run = loaded
    if call.status != expected or run.is_terminal:
        raise CallStateError(effect_key, call.status if not run.is_terminal else f"in a {run.status} run", expected)
    return call, run


def _redispatch(tx: Tx, run: Run, call: CallRow, now: datetime) -> OutboxEntry:
    if tx.advance_run(run.id, fence=run.fence, now=now, status="running") is None:
        raise FenceLost(run.id, run.fence)
    entry = runs.tool_entry(call.effect_key, call.tool, call.queue)
    tx.insert_outbox(entry, now)
    return entry


def approve(
    tx: Tx,
    registry: AgentRegistry,
    effect_key: str,
    *,
    principal: str,
    now: datetime,
    override_args: dict[str, Any] | None = None,
    remember: bool = False,
) -> list[OutboxEntry]:
    """Approve a call for its exact arguments (or for edited ones, validated and recorded).

    ``remember``: also "always allow this tool on this thread" (the call's thread), a durable
    decision later calls of the tool there are allowed by (after the agent's rules, before its
    mode; a deny or ask rule still wins).
    """
    if not principal:
        raise ValueError("an approval names the person who gives it (principal=...)")
    if not isinstance(remember, bool):
        raise ValueError(f"remember must be True or False, not {remember!r}")
    call, run = _load(tx, effect_key, "awaiting_approval")
    values: dict[str, Any] = {"status": "pending", "approved_by": principal, "approved_at": now}
    args = call.args
    if override_args is not None:
        tool = registry.get(run.agent).tool_named(call.tool) if run.agent in registry else None
        if tool is None:
            raise InvalidArguments(
                f"cannot check override arguments: agent {run.agent!r} is not loaded in this process"
            )
        try:
            tool.parse_arguments(override_args)
        except ToolArgumentsError as exc:
            raise InvalidArguments(f"override arguments for {call.tool!r} rejected: {exc}") from None
        args = render_result(override_args)
        values.update(args=args, args_hash=args_digest(args), original_args=call.args)
    values["approved_args_hash"] = args_digest(args)
    tx.update_call(effect_key, **values)
    if remember:
        tx.grant_tool(call.thread_id, call.tool, granted_by=principal, now=now)
        log.info("tool %s is always allowed on thread %s (by %s)", call.tool, call.thread_id, principal)
    announce_answer(tx, run, call, "approved", now)
    log.info(
        "call %s (%s) approved by %s%s",
        effect_key,
        call.tool,
        principal,
        " with edited arguments" if override_args is not None else "",
    )
    return [_redispatch(tx, run, call, now)]


def deny(tx: Tx, effect_key: str, *, reason: str, now: datetime, principal: str | None = None) -> list[OutboxEntry]:
    """Deny a call: the model sees ``denied: <reason>`` and the run goes on."""
    call, run = _load(tx, effect_key, "awaiting_approval")
    tx.update_call(effect_key, resolved_by=principal, resolved_at=now, resolution="denied")
    announce_answer(tx, run, call, "denied", now)
    _, entries = runs.record_call_result(
        tx,
        run,
        call,
        fence=run.fence,
        content=f"denied: {reason}",
        is_error=True,
        ends_turn=False,
        now=now,
        resume=True,
    )
    log.info("call %s (%s) denied%s: %s", effect_key, call.tool, f" by {principal}" if principal else "", reason)
    return entries


def resolve(
    tx: Tx,
    effect_key: str,
    resolution: Resolution,
    *,
    principal: str,
    now: datetime,
    result: Any = None,
) -> list[OutboxEntry]:
    """Settle a parked call: ``assume_done`` records ``result``; ``assume_not_done`` runs it again."""
    if resolution not in ("assume_done", "assume_not_done"):
        raise ValueError(f"resolution must be 'assume_done' or 'assume_not_done', not {resolution!r}")
    if not principal:
        raise ValueError("a resolution names the person who makes it (principal=...)")
    call, run = _load(tx, effect_key, "parked")
    tx.update_call(effect_key, resolution=resolution, resolved_by=principal, resolved_at=now)
    announce_answer(tx, run, call, resolution, now)
    if resolution == "assume_done":
        content = render_result(result) if result is not None else f"assumed done by {principal}"
        _, entries = runs.record_call_result(
            tx, run, call, fence=run.fence, content=content, is_error=False, ends_turn=False, now=now, resume=True
        )
        log.info("parked call %s (%s) assumed done by %s", effect_key, call.tool, principal)
        return entries
    # Deciding to run it again is also an approval of these arguments by the same person.
    tx.update_call(
        effect_key,
        status="pending",
        park_reason=None,
        approved_by=call.approved_by or principal,
        approved_at=now,
        approved_args_hash=args_digest(call.args),
    )
    log.warning(
        "parked call %s (%s): %s accepted the risk of a duplicate effect; running it again",
        effect_key,
        call.tool,
        principal,
    )
    return [_redispatch(tx, run, call, now)]
