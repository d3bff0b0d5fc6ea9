"""Starting an agent-tool run: its row in the parent's registry and the child run, in one transaction.

The agent tool is declared in :mod:`threads_celery.definitions.agent_tools`. Starting one submits
the child run (:mod:`threads_celery.transitions.runs`), and the run transitions in turn update
the row when the child moves (:mod:`threads_celery.transitions.agent_tools`); so starting sits
above both, and neither of them imports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from threads_celery.decisions.budgets import check_at
from threads_celery.definitions.agent_tools import Detached
from threads_celery.definitions.agents import Agent
from threads_celery.exceptions import ConfigError
from threads_celery.records import AgentToolRun, MilestoneOptions, OutboxEntry
from threads_celery.store import Tx
from threads_celery.transitions import runs

#: How long an awaited child may stay silent before the parent stops waiting (soft).
DEFAULT_AWAITED_NO_PROGRESS_MS = 120_000
INPUT_PREVIEW_CHARS = 500


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
