"""Agent-tool runs in the ledger: a child's signs of life, its end, and the finish delivery.

What a user declares (``agent_tool``, ``Detached``) is in :mod:`threads_celery.definitions.agent_tools`;
starting a run is :mod:`threads_celery.transitions.agent_tool_dispatch`. Here are the transitions of
a started run's row, each inside the caller's transaction: the run transitions call them when a
child run moves, so this module imports none of them.

A child is a real thread with stored messages. Its agent-tool run row (``agent_tool_runs``) is
the parent's registry entry: status, summary, output, progress snapshot, budgets and the finish
delivery ledger. Nothing here holds a worker while a child runs: the child's terminal transition
updates the row and records a ``threads.deliver`` task in the same transaction, and delivery
writes the parent's tool result (awaited) or fires ``on_finish`` / notify (detached).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol

from threads_celery.decisions.budgets import check_at
from threads_celery.records import AGENT_TOOL_HARD_TERMINAL, AgentToolRun, OutboxEntry
from threads_celery.store import Tx

DELIVER_TASK = "threads.deliver"
InterruptedReason = Literal[
    "no-progress",
    "window-exceeded",
    "not-tailable",
    "inspect-timeout",
    "inspect-failed",
    "recovery-deadline",
    "budget-exceeded",
]


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
