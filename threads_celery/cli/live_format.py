"""How the live view writes things: statuses, marks, shortened arguments and results."""

from __future__ import annotations

import json
from typing import Any

from threads_celery.records import TERMINAL_STATUSES, Event, Message, ToolCall, ToolResult

NEEDS_A_PERSON: frozenset[str] = frozenset({"parked", "awaiting_approval", "awaiting_variable"})
#: Statuses at which :func:`follow_run` stops watching.
STOP_STATUSES: frozenset[str] = TERMINAL_STATUSES | NEEDS_A_PERSON

STATUS_STYLES: dict[str, str] = {
    "queued": "cyan",
    "starting": "cyan",
    "running": "cyan",
    "waiting": "cyan",
    "completed": "bold green",
    "error": "bold red",
    "aborted": "bold red",
    "interrupted": "bold red",
    "parked": "bold yellow",
    "awaiting_approval": "bold yellow",
    "awaiting_variable": "bold yellow",
}
STATUS_MARKS: dict[str, str] = {
    "completed": "✔",
    "error": "✘",
    "aborted": "✘",
    "interrupted": "✘",
    "parked": "⏸",
    "awaiting_approval": "⏸",
    "awaiting_variable": "⏸",
}
WAITING_NOTES: dict[str, str] = {
    "parked": "a tool call may have run and is not safe to repeat; a person must decide",
    "awaiting_approval": "a tool call waits for approval",
    "awaiting_variable": "a tool call waits for a variable to be set",
}
#: An interrupted child is a soft stop (it may be retried), not a failure: yellow, not red.
CHILD_STYLES = {**STATUS_STYLES, "interrupted": "bold yellow"}
CHILD_END = {
    "agent_tool.finished": "completed",
    "agent_tool.error": "error",
    "agent_tool.aborted": "aborted",
    "agent_tool.interrupted": "interrupted",
}


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when something was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def format_args(raw: str, limit: int = 160) -> str:
    """A call's JSON arguments as ``key=value`` pairs on one line (raw text if not an object)."""
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return shorten(" ".join(raw.split()), limit)
    if not isinstance(data, dict):
        return shorten(json.dumps(data, ensure_ascii=False), limit)
    pairs = (f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in data.items())
    return shorten(", ".join(pairs), limit)


def format_result(content: str, *, limit: int = 400, max_lines: int = 6) -> str:
    """A tool result for display: JSON compacted, long text cut by characters and lines."""
    text = content.strip()
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    else:
        if isinstance(value, (dict, list)):
            text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    lines = text.splitlines() or [""]
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"… ({len(lines) - max_lines} more lines)"]
    return shorten("\n".join(lines), limit)


def message_from_event(event: Event) -> Message | None:
    """The stored message a ``message`` event carries (None for any other event)."""
    payload = event.payload
    if event.type != "message" or "seq" not in payload:
        return None
    result = payload.get("tool_result")
    return Message(
        thread_id=event.thread_id,
        seq=int(payload["seq"]),
        role=payload.get("role", "user"),
        text=payload.get("text") or "",
        tool_calls=tuple(ToolCall.from_json(c) for c in payload.get("tool_calls") or ()),
        tool_result=ToolResult.from_json(result) if result else None,
        run_id=event.run_id,
        created_at=event.created_at,
        meta=payload.get("meta"),
    )


def input_label(preview: str) -> str:
    """A child's input, short enough to tell two runs of one agent apart."""
    try:
        value: Any = json.loads(preview)
    except (json.JSONDecodeError, ValueError):
        value = preview
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, str)), "")
    return shorten(" ".join(str(value).split()), 32)
