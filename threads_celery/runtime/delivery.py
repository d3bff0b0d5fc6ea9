"""Finish delivery of agent-tool runs, and the backbone's pass over their budgets.

The pass loads each due row and applies what :mod:`threads_celery.decisions.budgets` decides
(look again later, tear the child down, or inspect a silent child and seal what was found).

Delivery is a claim-and-lease ledger on the agent-tool row: a deliverer claims it, fires the
hooks, and marks the status delivered in one transaction with the parent's tool result. Two
deliveries of the same finish fire once; a deliverer that dies or a hook that raises leaves the
claim to lapse, and the backbone delivers again (at least once under a crash, so ``on_finish``
handlers must be idempotent).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from threads_celery.decisions.budgets import (
    INSPECT_TIMEOUT_S,
    RECOVERY_DEADLINE_S,
    CheckAt,
    Finding,
    TearDown,
    decide_budget,
    interruption_for,
)
from threads_celery.decisions.retry import DELIVERY_BACKOFF
from threads_celery.definitions.agent_tools import check_child_output
from threads_celery.definitions.prompts import shape_result
from threads_celery.definitions.tools import Tool, render_result
from threads_celery.records import (
    AGENT_TOOL_HARD_TERMINAL,
    AgentToolFailure,
    AgentToolResult,
    AgentToolRun,
    OutboxEntry,
    Run,
)
from threads_celery.runtime.hooks import observe
from threads_celery.runtime.ports import Worker
from threads_celery.telemetry.observability import emit
from threads_celery.transitions import agent_tools, finish_callbacks, runs
from threads_celery.workspace.files import ThreadFiles, copy_back_to_parent

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent, AgentRegistry
    from threads_celery.store import Tx

log = logging.getLogger("threads_celery.transitions.agent_tools")

DELIVERY_LEASE = timedelta(seconds=60)


def _send_finish_callback(worker: Worker, run: Run, status: str, outbox_key: str) -> str:
    """Send the signature a run was started with (``on_finish``), then consume its outbox row.

    Sent before the row goes: a worker lost in between leaves the row, which the backbone
    publishes again (so the callback is sent at least once, under one task id). A send the broker
    refuses leaves the row too, for the same retry.
    """
    spec = finish_callbacks.spec_of(run)
    assert spec is not None
    if run.status != status:
        with worker.store.transaction() as tx:
            tx.delete_outbox(outbox_key)
        return f"skipped: the run is {run.status}"
    entry = finish_callbacks.callback_entry(run, spec, status)
    send = getattr(worker.publish, "send", None)
    try:
        if callable(send):
            send(entry)  # raises what the broker's refusal raised
        else:
            worker.publish([entry])
    except Exception as exc:  # noqa: BLE001 - the outbox row stays: the backbone sends it again
        log.warning("sending the finish of %s to %s failed, left for the backbone: %s", run.id, entry.task, exc)
        return f"failed: {type(exc).__name__}"
    with worker.store.transaction() as tx:
        tx.delete_outbox(outbox_key)
    emit("run", "run:finish_sent", run_id=run.id, status=status, task=entry.task)
    return f"sent {status} to {entry.task}"


def deliver(worker: Worker, run_id: str, status: str) -> str:
    """Deliver the finish ``status`` of agent-tool run ``run_id`` (idempotent)."""
    now = worker.clock()
    # The outbox row goes once this finish needs no more delivering (delivered, or moot): left
    # there, the backbone would publish it again forever. While another delivery holds the claim
    # it stays, so this finish is tried again when that one is done.
    outbox_key = agent_tools.deliver_entry(run_id, status).key
    with worker.store.transaction() as tx:
        row: AgentToolRun | None = tx.get_agent_tool_run(run_id, lock=True)
        skipped = None
        if row is None:
            ended = tx.get_run(run_id)
            if ended is not None and finish_callbacks.spec_of(ended) is not None:
                return _send_finish_callback(worker, ended, status, outbox_key)
            skipped = "skipped: no such agent-tool run"
        elif status in row.delivered:
            skipped = "skipped: already delivered"
        elif status == "interrupted" and row.status in AGENT_TOOL_HARD_TERMINAL:
            skipped = "skipped: the run ended after it was given up on"
        elif row.status != status:
            skipped = f"skipped: the run is {row.status}"
        if skipped is not None:
            tx.delete_outbox(outbox_key)
            return skipped
        assert row is not None
        if not tx.claim_delivery(run_id, owner=worker.worker_id, until=now + DELIVERY_LEASE, now=now):
            return "skipped: another delivery holds the claim"
        attempts = row.delivery_attempts  # failed attempts so far: the backoff grows with them
    try:
        result = finish_result(worker, row)
        parent = _parent_agent(worker, row)
        info = _with_result(row, result)
        entries = _fire_hooks(worker, parent, info, result)
    except Exception as exc:  # noqa: BLE001 - the claim lapses and the backbone retries
        backoff = DELIVERY_BACKOFF.delay_s(attempts + 1)
        with worker.store.transaction() as tx:
            tx.update_agent_tool_run(run_id, delivery_lease_until=worker.clock() + timedelta(seconds=backoff))
            tx.delete_outbox(outbox_key)  # the backbone delivers again when the backoff ends
        log.warning(
            "delivery of %s (%s) failed, retrying in %gs: %s: %s", run_id, status, backoff, type(exc).__name__, exc
        )
        return f"failed: {type(exc).__name__}"
    with worker.store.transaction() as tx:
        current = tx.get_agent_tool_run(run_id, lock=True)
        if current is None:
            # Cleared (clear_agent_tool_runs) while its hooks ran: nothing is left to mark.
            tx.delete_outbox(outbox_key)
        else:
            values: dict[str, Any] = {
                "delivered": sorted({*current.delivered, status}),
                "delivery_owner": None,
                "delivery_lease_until": None,
                "delivery_attempts": 0,
            }
            if isinstance(result, AgentToolResult):
                values.update(summary=result.summary, output=result.output)
            elif status == "completed":
                values.update(status="error", error=result.error)
            tx.update_agent_tool_run(run_id, **values)
            tx.delete_outbox(outbox_key)
            entries += settle_parent_call(tx, row, result, worker.clock(), worker.registry, worker.settings.files_root)
    worker.publish(entries)
    if current is None:
        return "skipped: the agent-tool run was cleared during its delivery"
    emit("agent_tool", "agent_tool:delivered", run_id=run_id, status=status, agent_type=row.agent_type)
    return f"delivered {status}"


def finish_result(worker: Worker, row: AgentToolRun) -> AgentToolResult | AgentToolFailure:
    """The result the parent sees, asking the child agent for structured output if it has any."""
    result = row.result()
    if not isinstance(result, AgentToolResult):
        assert result is not None, f"{row.run_id} is not finished"
        return result
    child = worker.registry.get(row.agent_type) if row.agent_type in worker.registry else None
    get_output = getattr(child, "get_agent_tool_output", None)
    schema_tool = _output_schema_tool(worker, row)
    if child is None or not callable(get_output):
        if schema_tool is None:
            return result
        # No structured output of its own: the child's final text is its output.
        checked, error = check_child_output(schema_tool, row.agent_type, result.summary)
        if error is not None:
            return AgentToolFailure("error", error, retryable=False)
        return AgentToolResult(run_id=row.run_id, summary=result.summary, output=checked)
    output = get_output(row.run_id)
    if output is None:
        return AgentToolFailure("error", "the agent tool run completed without an output", retryable=False)
    if schema_tool is not None:
        output, error = check_child_output(schema_tool, row.agent_type, output)
        if error is not None:
            return AgentToolFailure("error", error, retryable=False)
    get_summary = getattr(child, "get_agent_tool_summary", None)
    summary = get_summary(row.run_id, output) if callable(get_summary) else result.summary
    return AgentToolResult(run_id=row.run_id, summary=summary or "", output=output)


def _output_schema_tool(worker: Worker, row: AgentToolRun) -> Tool | None:
    """The parent's agent-tool definition that started ``row``, when it declares an output schema."""
    if row.parent_effect_key is None:
        return None
    with worker.store.read() as tx:
        loaded = tx.get_call_and_run(row.parent_effect_key)
    if loaded is None:
        return None
    call, parent_run = loaded
    parent = worker.registry.get(parent_run.agent) if parent_run.agent in worker.registry else None
    definition = parent.tool_named(call.tool) if parent is not None else None
    if definition is None or definition.child_agent is None or definition.output is None:
        return None
    return definition


def result_json(result: AgentToolResult | AgentToolFailure) -> Any:
    """What the parent model sees: the output (or summary string), or the failure envelope."""
    if isinstance(result, AgentToolFailure):
        return result.to_json()
    return result.output if result.output is not None else result.summary


def _with_result(row: AgentToolRun, result: AgentToolResult | AgentToolFailure) -> AgentToolRun:
    if isinstance(result, AgentToolResult):
        return replace(row, summary=result.summary, output=result.output)
    return row


def _parent_agent(worker: Worker, row: AgentToolRun) -> Agent | None:
    with worker.store.read() as tx:
        name = tx.thread_agent(row.parent_thread_id)
    return worker.registry.get(name) if name is not None and name in worker.registry else None


def _fire_hooks(
    worker: Worker, parent: Agent | None, row: AgentToolRun, result: AgentToolResult | AgentToolFailure
) -> list[OutboxEntry]:
    entries: list[OutboxEntry] = []
    if parent is not None:
        hook = getattr(parent, "on_agent_tool_finish", None)
        if callable(hook):
            hook(row, result)
        observe(parent, "after_subagent", (row, result))
    if not row.detached:
        return entries
    if row.on_finish:
        method = getattr(parent, row.on_finish, None) if parent is not None else None
        if not callable(method):
            raise LookupError(f"the parent agent has no method {row.on_finish!r} to deliver to")
        method(row, result)
    elif row.notify:
        entries += _notify(worker, parent, row, result)
    return entries


def _notify(
    worker: Worker, parent: Agent | None, row: AgentToolRun, result: AgentToolResult | AgentToolFailure
) -> list[OutboxEntry]:
    """Inject a message into the parent thread (once per run and status) and give it a turn."""
    formatter = getattr(parent, "format_detached_completion", None)
    text = formatter(row, result) if callable(formatter) else default_completion_text(row, result)
    if not text:
        return []
    status = result.status
    meta = {
        "key": f"detached-finish:{row.run_id}:{status}",
        "source": (row.notify or {}).get("source", "detached-agent-tool"),
        "run_id": row.run_id,
        "agent_type": row.agent_type,
        "status": status,
    }
    with worker.store.transaction() as tx:
        thread = tx.get_thread(row.parent_thread_id)
        if thread is None:
            return []
        _, entries = runs.submit_run(
            tx,
            agent=thread.agent,
            config_hash=thread.config_hash,
            message=text,
            now=worker.clock(),
            thread_id=row.parent_thread_id,
            run_id=f"notify:{row.run_id}:{status}",
            input_meta=meta,
        )
    return entries


def default_completion_text(row: AgentToolRun, result: AgentToolResult | AgentToolFailure) -> str:
    label = row.display_name or row.agent_type
    if isinstance(result, AgentToolResult):
        return f"[{label} finished] {render_result(result_json(result))}"
    return f"[{label} {result.status}] {result.error}"


def _with_returned_attachments(value: Any, files_root: str, row: AgentToolRun, parent_thread_id: str) -> Any:
    """Files the child left in its area (beyond the ones it was given) are copied back to the
    parent, and the returned references are the parent's."""
    child = ThreadFiles(files_root, row.child_thread_id or "")
    given = set(str(row.input or "").rpartition("Attachments: ")[2].split(", ")) if row.input else set()
    produced = [name for name in child.list() if name not in given]
    if not produced:
        return value
    refs = copy_back_to_parent(child, ThreadFiles(files_root, parent_thread_id), produced)
    shaped = value if isinstance(value, dict) else {"text": value}
    return {**shaped, "attachments": refs}


def settle_parent_call(
    tx: Tx,
    row: AgentToolRun,
    result: AgentToolResult | AgentToolFailure,
    now: datetime,
    registry: AgentRegistry | None = None,
    files_root: str | None = None,
) -> list[OutboxEntry]:
    """For an awaited run started by a model call: the child's result becomes the call's result
    (when its finish is delivered, or at once when no delivery will come: see :mod:`.child_runs`).

    A prompt tool's result is shaped by its flags from the child thread's messages.
    """
    if row.parent_effect_key is None:
        return []
    loaded = tx.get_call_and_run(row.parent_effect_key, lock=True)
    if loaded is None:
        return []
    call, parent_run = loaded
    if call.status != "started" or parent_run.status != "waiting":
        return []  # already settled (a redelivery), or the parent moved on
    value = result_json(result)
    parent = registry.get(parent_run.agent) if registry is not None and parent_run.agent in registry else None
    definition = parent.tool_named(call.tool) if parent is not None else None
    if definition is not None and definition.prompt_options is not None and row.child_thread_id is not None:
        error = None if isinstance(result, AgentToolResult) else result.error
        summary = result.summary if isinstance(result, AgentToolResult) else ""
        value = shape_result(definition.prompt_options, summary, tx.list_messages(row.child_thread_id), error)
        if files_root is not None and definition.prompt_options.init_attachments_property:
            value = _with_returned_attachments(value, files_root, row, parent_run.thread_id)
    elif definition is not None and definition.subagent_op is not None:
        # The model needs the instance id to talk to the same subagent again.
        reply = value if isinstance(result, AgentToolResult) else {"error": value}
        value = {"instance_id": row.child_thread_id, "reply": reply}
    _, entries = runs.record_call_result(
        tx,
        parent_run,
        call,
        fence=parent_run.fence,
        content=render_result(value),
        is_error=isinstance(result, AgentToolFailure),
        ends_turn=False,
        now=now,
        resume=True,
    )
    return entries


def reconcile_agent_tools(worker: Worker, *, limit: int = 200) -> dict[str, int]:
    """Give up on runs past their budgets, and deliver again what a dead deliverer left."""
    now = worker.clock()
    entries: list[OutboxEntry] = []
    expired = silent = redelivered = 0
    observed: list[tuple[str, dict[str, Any]]] = []
    started = time.monotonic()
    # The lock order every transaction keeps (see runs.LOCK_ORDER): a child's run, its thread,
    # then its agent-tool row, then the parent's thread. So the due rows are read unlocked, and
    # each is settled in a transaction of its own that locks its child's run and thread first.
    # (Locking the due rows up front, as one transaction, deadlocked against a child's step
    # commit: it held the child's thread and waited for the row, while this tick held the row
    # and waited for that thread to record a grandchild's interruption there.)
    with worker.store.read() as tx:
        due = tx.due_agent_tool_runs(now=now, limit=limit, lock=False)
    for candidate in due:
        with worker.store.transaction() as tx:
            child_run = tx.get_run(candidate.child_run_id, lock=True) if candidate.child_run_id else None
            if child_run is not None:
                tx.get_thread(child_run.thread_id, lock=True)
            row = tx.get_agent_tool_run(candidate.run_id, lock=True)
            if row is None:
                continue  # cleared meanwhile
            # Read again under the lock: a signal or another reconciler may have come first, and
            # the branches below decide from the row's current fields.
            if not agent_tools.is_active(row.status):
                tx.update_agent_tool_run(row.run_id, check_at=None)
                continue
            budget = decide_budget(
                started_at=row.started_at,
                last_signal_at=row.last_signal_at,
                max_budget_ms=row.max_budget_ms,
                no_progress_budget_ms=row.no_progress_budget_ms,
                detached=row.detached,
                now=now,
            )
            if isinstance(budget, CheckAt):
                tx.update_agent_tool_run(row.run_id, check_at=budget.at)
                continue
            if isinstance(budget, TearDown):
                _tear_down(tx, row, now, "budget exceeded")
                interrupt = budget.interrupt
                expired += 1
            else:
                # Before giving up on a silent child, look at it: it may have ended, or be gone.
                finding = _inspect_child(tx, row, started=started)
                observed.append(("agent_tool:recovery:row", {"run_id": row.run_id, "finding": finding}))
                found = interruption_for(finding, no_progress_budget_ms=row.no_progress_budget_ms)
                if found is None:
                    continue  # its finish is recorded and delivered on its own
                interrupt = found
                silent += 1
            entries += agent_tools.seal_interrupted(
                tx,
                row,
                reason=interrupt.reason,
                error=interrupt.error,
                child_still_running=interrupt.child_still_running,
                now=now,
            )
            observed.append(("agent_tool:interrupted", {"run_id": row.run_id, "reason": interrupt.reason}))
    with worker.store.transaction() as tx:
        for row in tx.undelivered_agent_tool_runs(now=now, limit=limit):
            if row.status in row.delivered:
                tx.update_agent_tool_run(row.run_id, delivery_owner=None, delivery_lease_until=None)
                continue
            entry = agent_tools.deliver_entry(row.run_id, row.status)
            tx.delete_outbox(entry.key)
            tx.insert_outbox(entry, now)
            entries.append(entry)
            redelivered += 1
    worker.publish(entries)
    for event_type, payload in observed:
        emit("agent_tool", event_type, **payload)
    return {"budget_exceeded": expired, "no_progress": silent, "redelivered": redelivered}


def _inspect_child(tx: Tx, row: AgentToolRun, *, started: float) -> Finding:
    """What the silent child's own record says: ended, silent, gone, failed, slow or late.

    A missing record is "gone" only when the row says there was one; an inspection that raises
    or is slow is never taken for a finish.
    """
    if time.monotonic() - started > RECOVERY_DEADLINE_S:
        return "late"
    began = time.monotonic()
    try:
        child = tx.get_run(row.child_run_id) if row.child_run_id else None
    except Exception as exc:  # noqa: BLE001 - any failure to look is an inspect failure
        log.warning("inspecting child of %s failed: %s: %s", row.run_id, type(exc).__name__, exc)
        return "failed"
    if time.monotonic() - began > INSPECT_TIMEOUT_S:
        return "slow"
    if child is None:
        return "gone"
    return "ended" if child.is_terminal else "silent"


def _tear_down(tx: Tx, row: AgentToolRun, now: datetime, reason: str) -> None:
    """Cancel the child run without delivering 'aborted' (the caller seals the outcome)."""
    if row.child_run_id is None:
        return
    child = tx.get_run(row.child_run_id, lock=True)
    if child is None or child.is_terminal:
        return
    thread = tx.get_thread(child.thread_id, lock=True)
    tx.advance_run(
        child.id,
        fence=child.fence,
        now=now,
        status="aborted",
        error=reason,
        finished_at=now,
        lease_owner=None,
        lease_expires_at=None,
    )
    if thread is not None and thread.active_run_id == child.id:
        runs.release_thread(tx, child, now)
