"""Agent-tool runs in the ledger: starting a child run, its signs of life, its end and delivery.

What a user declares (``agent_tool``, ``Detached``) is in :mod:`threads_celery.definitions.agent_tools`;
here are the transitions over the ledger that carry such a call out, each inside the caller's
transaction.

A child is a real thread with stored messages. Its agent-tool run row (``agent_tool_runs``) is
the parent's registry entry: status, summary, output, progress snapshot, budgets and the finish
delivery ledger. Nothing here holds a worker while a child runs: the child's terminal transition
updates the row and records a ``threads.deliver`` task in the same transaction, and delivery
writes the parent's tool result (awaited) or fires ``on_finish`` / notify (detached).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from threads_celery.definitions.agent_tools import Detached
from threads_celery.definitions.agents import Agent
from threads_celery.exceptions import ConfigError
from threads_celery.records import (
    AGENT_TOOL_HARD_TERMINAL,
    AgentToolRun,
    MilestoneOptions,
    OutboxEntry,
)
from threads_celery.store import Tx
from threads_celery.transitions import runs

DELIVER_TASK = "threads.deliver"
#: How long an awaited child may stay silent before the parent stops waiting (soft).
DEFAULT_AWAITED_NO_PROGRESS_MS = 120_000
INPUT_PREVIEW_CHARS = 500
InterruptedReason = Literal[
    "no-progress",
    "window-exceeded",
    "not-tailable",
    "inspect-timeout",
    "inspect-failed",
    "recovery-deadline",
    "budget-exceeded",
]


def input_preview(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text[:INPUT_PREVIEW_CHARS]


def child_message(child: Agent, value: Any) -> str:
    """The child's first user message for an input value."""
    formatter = getattr(child, "format_agent_tool_input", None)
    if callable(formatter):
        return str(formatter(value))
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and set(value) == {"message"} and isinstance(value["message"], str):
        return value["message"]
    return json.dumps(value, default=str, sort_keys=True)


def _budget_ms(value: float | None) -> int | None:
    """Milliseconds as stored: None, 0 or infinity disable a budget."""
    if value is None or value == 0 or (isinstance(value, float) and math.isinf(value)):
        return None
    return int(value)


def check_at(
    *, started: datetime, last_signal: datetime | None, max_budget_ms: int | None, no_progress_ms: int | None
) -> datetime | None:
    """When the backbone must look at a run next: the earliest budget that can run out."""
    due = []
    if max_budget_ms is not None:
        due.append(started + timedelta(milliseconds=max_budget_ms))
    if no_progress_ms is not None and last_signal is not None:
        due.append(last_signal + timedelta(milliseconds=no_progress_ms))
    return min(due) if due else None


def dispatch(
    tx: Tx,
    *,
    run_id: str,
    parent_thread_id: str,
    child: Agent,
    input_value: Any,
    now: datetime,
    parent_run_id: str | None = None,
    parent_tool_call_id: str | None = None,
    parent_effect_key: str | None = None,
    display_order: int = 0,
    display_name: str | None = None,
    detached: Detached | None = None,
    event_delivery: str = "all",
    max_concurrent: int | None = None,
    child_thread_id: str | None = None,
    max_window_ms: float | None = None,
) -> tuple[AgentToolRun, list[OutboxEntry], bool]:
    """Start a child run for ``run_id`` unless one exists; returns (row, entries, started).

    With ``child_thread_id`` the run continues that child thread (a subagent instance)."""
    existing = tx.get_agent_tool_run(run_id)
    if existing is not None:
        return existing, [], False
    preview = input_preview(input_value)
    base: dict[str, Any] = {
        "run_id": run_id,
        "parent_thread_id": parent_thread_id,
        "parent_run_id": parent_run_id,
        "parent_tool_call_id": parent_tool_call_id,
        "parent_effect_key": parent_effect_key,
        "agent_type": child.name,
        "display_order": display_order,
        "display_name": display_name,
        "input": input_value,
        "input_preview": preview,
        "detached": detached is not None,
        "event_delivery": event_delivery,
        "delivered": [],
        "delivery_attempts": 0,
        "created_at": now,
        "started_at": now,
    }
    started_event = {
        "run_id": run_id,
        "agent_type": child.name,
        "input_preview": preview,
        "order": display_order,
        "display": display_name or child.name,
        "sequence": 0,
    }
    # Lock the parent thread first, so two dispatches at once count each other (READ COMMITTED).
    tx.get_thread(parent_thread_id, lock=True)
    if max_concurrent is not None and tx.count_active_agent_tool_runs(parent_thread_id) >= max_concurrent:
        error = f"too many concurrent agent tool runs: the cap (max_concurrent_agent_tools) is {max_concurrent}"
        tx.insert_agent_tool_run(
            {**base, "status": "error", "error": error, "finished_at": now, "delivered": ["error"]}
        )
        tx.append_event(parent_thread_id, parent_run_id, "agent_tool.started", started_event, now)
        tx.append_event(parent_thread_id, parent_run_id, "agent_tool.error", {"run_id": run_id, "error": error}, now)
        row = tx.get_agent_tool_run(run_id)
        assert row is not None
        return row, [], False
    if detached is not None:
        max_ms, silence_ms = _budget_ms(detached.max_budget_ms), _budget_ms(detached.no_progress_budget_ms)
        notify = (
            detached.notify
            if isinstance(detached.notify, Mapping)
            else ({"source": "detached-agent-tool"} if detached.notify else None)
        )
        base.update(
            on_finish=detached.on_finish,
            notify=dict(notify) if notify else None,
            on_milestones=_milestone_options(detached.on_milestones),
            max_budget_ms=max_ms,
            no_progress_budget_ms=silence_ms,
            check_at=check_at(started=now, last_signal=None, max_budget_ms=max_ms, no_progress_ms=silence_ms),
        )
    else:
        # Awaited: a silent child is given up on (softly) after the no-progress window; a
        # finite maximum window (the parent agent's agent_tool_max_window_ms) tears it down.
        window = _budget_ms(max_window_ms)
        base.update(
            no_progress_budget_ms=DEFAULT_AWAITED_NO_PROGRESS_MS,
            max_budget_ms=window,
            check_at=check_at(started=now, last_signal=None, max_budget_ms=window, no_progress_ms=None),
        )
    child_run_id = runs.new_id("run")
    tx.insert_agent_tool_run({**base, "status": "running", "child_run_id": child_run_id})
    tx.append_event(parent_thread_id, parent_run_id, "agent_tool.started", started_event, now)
    child_run, entries = runs.submit_run(
        tx,
        agent=child.name,
        config_hash=child.config_hash(),
        message=child_message(child, input_value),
        now=now,
        run_id=child_run_id,
        thread_id=child_thread_id,
        parent_thread_id=parent_thread_id,
        agent_tool_run_id=run_id,
    )
    tx.update_agent_tool_run(run_id, child_thread_id=child_run.thread_id)
    row = tx.get_agent_tool_run(run_id)
    assert row is not None
    return row, entries, True


def _milestone_options(value: Any) -> MilestoneOptions | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        mode = value.get("mode", "narrate")
        if mode not in ("narrate", "react"):
            raise ConfigError(f"on_milestones mode must be 'narrate' or 'react', not {mode!r}")
        return {"names": list(value.get("names", [])), "mode": mode}
    return {"names": list(value), "mode": "narrate"}


def deliver_entry(run_id: str, status: str) -> OutboxEntry:
    return OutboxEntry(
        key=f"deliver:{run_id}:{status}",
        task=DELIVER_TASK,
        args=(run_id, status),
        argsrepr=f"(agent tool {run_id} {status})",
    )


class FinishedChild(Protocol):
    """What :func:`child_finished` reads of the child run: which agent-tool run it serves."""

    @property
    def agent_tool_run_id(self) -> str | None: ...


def child_finished(
    tx: Tx, run: FinishedChild, *, status: str, output: str | None, error: str | None, now: datetime
) -> list[OutboxEntry]:
    """The child ``run`` ended: update its agent-tool row and record the finish delivery."""
    assert run.agent_tool_run_id is not None
    row = tx.get_agent_tool_run(run.agent_tool_run_id, lock=True)
    if row is None or row.status in AGENT_TOOL_HARD_TERMINAL:
        return []
    values: dict[str, Any] = {"status": status, "finished_at": now, "check_at": None}
    if status == "completed":
        values.update(summary=output or "", reason=None, child_still_running=None, error=None)
    else:
        values.update(
            error=error or ("agent tool run was cancelled" if status == "aborted" else "agent tool run failed")
        )
    tx.update_agent_tool_run(row.run_id, **values)
    event = {"completed": "agent_tool.finished", "error": "agent_tool.error", "aborted": "agent_tool.aborted"}.get(
        status, f"agent_tool.{status}"
    )
    payload: dict[str, Any] = {"run_id": row.run_id}
    if status == "completed":
        payload["summary"] = output or ""
    elif status == "aborted":
        payload["reason"] = values["error"]
    else:
        payload["error"] = values["error"]
    tx.append_event(row.parent_thread_id, row.parent_run_id, event, payload, now)
    entry = deliver_entry(row.run_id, status)
    tx.insert_outbox(entry, now)
    return [entry]


def seal_interrupted(
    tx: Tx, row: AgentToolRun, *, reason: str, error: str, child_still_running: bool | None, now: datetime
) -> list[OutboxEntry]:
    """Give up waiting on a child (soft): interrupted with a reason, and deliver that."""
    tx.update_agent_tool_run(
        row.run_id,
        status="interrupted",
        reason=reason,
        error=error,
        child_still_running=child_still_running,
        check_at=None,
    )
    tx.append_event(
        row.parent_thread_id,
        row.parent_run_id,
        "agent_tool.interrupted",
        {"run_id": row.run_id, "error": error, "reason": reason, "child_still_running": child_still_running},
        now,
    )
    entry = deliver_entry(row.run_id, "interrupted")
    tx.insert_outbox(entry, now)
    return [entry]


def is_active(status: str) -> bool:
    return status in ("starting", "running")


def child_signal(tx: Tx, agent_tool_run_id: str, now: datetime, *, chunk: dict[str, Any] | None = None) -> None:
    """The child showed life (a step, a tool result, progress): reset its silence window.

    With ``chunk``, the child's new message is also forwarded to the parent's event log, unless
    the run was started with ``event_delivery="terminal"``.
    """
    row = tx.get_agent_tool_run(agent_tool_run_id)
    if row is None or not is_active(row.status):
        return
    due = check_at(
        started=row.started_at or now,
        last_signal=now,
        max_budget_ms=row.max_budget_ms,
        no_progress_ms=row.no_progress_budget_ms,
    )
    tx.update_agent_tool_run(agent_tool_run_id, last_signal_at=now, check_at=due)
    if chunk is not None and row.event_delivery == "all":
        tx.append_event(
            row.parent_thread_id, row.parent_run_id, "agent_tool.chunk", {"run_id": row.run_id, "body": chunk}, now
        )
