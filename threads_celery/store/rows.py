"""Rows become records here: the one place that knows both a table's columns and a record's fields.

Every query of the store returns what these functions build from its rows (the frozen values
of :mod:`threads_celery.records`), so no SQLAlchemy ``Row`` leaves the store package.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Row, RowMapping

from threads_celery.records import AgentToolRun, CallRow, Message, Milestone, Run, Thread, ToolCall, ToolResult


def thread_from_row(row: Row[Any]) -> Thread:
    m = row._mapping
    return Thread(
        id=m["id"],
        agent=m["agent"],
        config_hash=m["config_hash"],
        parent_thread_id=m["parent_thread_id"],
        active_run_id=m["active_run_id"],
        event_seq=int(m["event_seq"] or 0),
        created_at=m["created_at"],
        tenant=m["tenant"],
        branch=m.get("branch"),
    )


def run_from_row(row: Row[Any]) -> Run:
    return run_from_mapping(row._mapping)


def run_from_mapping(m: RowMapping | Mapping[str, Any]) -> Run:
    return Run(
        id=m["id"],
        thread_id=m["thread_id"],
        agent=m["agent"],
        status=m["status"],
        step=m["step"],
        fence=m["fence"],
        input=m["input"],
        output=m["output"],
        error=m["error"],
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        lease_owner=m["lease_owner"],
        lease_expires_at=m["lease_expires_at"],
        input_meta=m["input_meta"],
        agent_tool_run_id=m["agent_tool_run_id"],
        traceparent=m.get("traceparent"),
        lost_step=m.get("lost_step"),
        lost_times=m.get("lost_times") or 0,
        voided_step=m.get("voided_step"),
        voided_requests=m.get("voided_requests") or 0,
        deploy_version=m.get("deploy_version"),
        deploy_policy=m.get("deploy_policy"),
        deploy_pin_reason=m.get("deploy_pin_reason"),
        deploy_checked=m.get("deploy_checked"),
    )


def call_from_mapping(
    m: RowMapping | Mapping[str, Any],
    *,
    next_call: tuple[str, str, str | None] | None = None,
    previous_unsettled: bool = False,
) -> CallRow:
    return CallRow(
        effect_key=m["effect_key"],
        run_id=m["run_id"],
        thread_id=m["thread_id"],
        step=m["step"],
        index=m["idx"],
        call_id=m["call_id"],
        tool=m["tool"],
        args=m["args"],
        status=m["status"],
        attempt=m["attempt"],
        calls_in_step=m["calls_in_step"],
        effect=m["effect"],
        queue=m["queue"],
        dedup_window_ms=m["dedup_window_ms"],
        finality=m["finality"],
        first_started_at=m["first_started_at"],
        lease_expires_at=m["lease_expires_at"],
        result=m["result"],
        is_error=bool(m["is_error"]),
        park_reason=m["park_reason"],
        resolution=m["resolution"],
        resolved_by=m["resolved_by"],
        approved_by=m["approved_by"],
        approved_args_hash=m["approved_args_hash"],
        original_args=m["original_args"],
        batch=m.get("batch"),
        next_call=next_call,
        previous_unsettled=previous_unsettled,
        lost_times=m.get("lost_times") or 0,
    )


def message_from_row(row: Row[Any]) -> Message:
    return message_from_mapping(row._mapping)


def message_from_mapping(m: RowMapping | Mapping[str, Any]) -> Message:
    parts = m["parts"] or {}
    return Message(
        thread_id=m["thread_id"],
        seq=m["seq"],
        role=m["role"],
        text=m["text"] or "",
        tool_calls=tuple(ToolCall.from_json(c) for c in parts.get("tool_calls", ())),
        tool_result=ToolResult.from_json(parts["tool_result"]) if "tool_result" in parts else None,
        run_id=m["run_id"],
        created_at=m["created_at"],
        meta=m["meta"],
        key=m["key"],
        superseded_by=m.get("superseded_by"),
    )


def messages_from_json(items: list[dict[str, Any]] | None) -> list[Message]:
    """Message rows read as a JSON array (``json_build_object`` of their columns, in order): the
    timestamps come as ISO 8601 text and are read back as aware UTC datetimes."""
    return [
        message_from_mapping({**item, "created_at": datetime.fromisoformat(item["created_at"]).astimezone(UTC)})
        for item in items or ()
    ]


def agent_tool_run_from_row(row: Row[Any], milestones: tuple[Milestone, ...]) -> AgentToolRun:
    m = row._mapping
    return AgentToolRun(
        run_id=m["run_id"],
        parent_thread_id=m["parent_thread_id"],
        agent_type=m["agent_type"],
        status=m["status"],
        parent_run_id=m["parent_run_id"],
        parent_tool_call_id=m["parent_tool_call_id"],
        parent_effect_key=m["parent_effect_key"],
        display_order=m["display_order"],
        display_name=m["display_name"],
        child_thread_id=m["child_thread_id"],
        child_run_id=m["child_run_id"],
        input=m["input"],
        input_preview=m["input_preview"] or "",
        reason=m["reason"],
        child_still_running=m["child_still_running"],
        error=m["error"],
        summary=m["summary"],
        output=m["output"],
        progress=m["progress"],
        last_signal_at=m["last_signal_at"],
        detached=bool(m["detached"]),
        event_delivery=m["event_delivery"],
        on_finish=m["on_finish"],
        notify=m["notify"],
        on_milestones=m["on_milestones"],
        max_budget_ms=m["max_budget_ms"],
        no_progress_budget_ms=m["no_progress_budget_ms"],
        delivered=tuple(m["delivered"] or ()),
        delivery_attempts=m["delivery_attempts"] or 0,
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        milestones=milestones,
    )
