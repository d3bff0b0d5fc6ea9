"""Frozen domain values: what the store hands out. Rows never leave the store module."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from threads_celery.decisions.effects import Effect, Finality

RunStatus = Literal[
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_variable",
    "waiting",
    "parked",
    "completed",
    "error",
    "aborted",
    "interrupted",
]

#: The tenant of threads started without one (the CLI, the Python client, single-tenant APIs).
DEFAULT_TENANT = "default"
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "error", "aborted", "interrupted"})
ACTIVE_STATUSES: frozenset[str] = frozenset(
    {"queued", "running", "awaiting_approval", "awaiting_variable", "waiting", "parked"}
)

Role = Literal["user", "assistant", "tool"]
#: ``finished``: a concurrent call whose result is recorded but not yet shown (it waits for the
#: calls before it in the reply, so results join the conversation in call order).
CallStatus = Literal[
    "pending",
    "awaiting_approval",
    "awaiting_variable",
    "started",
    "finished",
    "completed",
    "error",
    "parked",
    "skipped",
]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asked for. ``args`` is the raw JSON text the model sent."""

    id: str
    name: str
    args: str
    effect_key: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "args": self.args, "effect_key": self.effect_key}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolCall:
        return cls(id=data["id"], name=data["name"], args=data["args"], effect_key=data["effect_key"])


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the model sees for one call: ``content`` is text, ``is_error`` marks a failure."""

    call_id: str
    name: str
    content: str
    is_error: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "name": self.name,
            "content": self.content,
            "is_error": self.is_error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        return cls(
            call_id=data["call_id"],
            name=data["name"],
            content=data["content"],
            is_error=bool(data.get("is_error", False)),
        )


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message of a thread, in order (``seq`` counts from 0 per thread)."""

    thread_id: str
    seq: int
    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_result: ToolResult | None = None
    run_id: str | None = None
    created_at: datetime | None = None
    meta: dict[str, Any] | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A snapshot of one run: one user message driven to an answer."""

    id: str
    thread_id: str
    agent: str
    status: RunStatus
    step: int
    fence: int
    input: str
    output: str | None = None
    error: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    input_meta: dict[str, Any] | None = None
    agent_tool_run_id: str | None = None
    #: The W3C traceparent of the run's span (see :mod:`threads_celery.telemetry.tracing`), None untraced.
    traceparent: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class RunHandle:
    """What :meth:`Threads.start` returns at once: the ids to wait on or watch."""

    run_id: str
    thread_id: str
    status: RunStatus = "queued"


@dataclass(frozen=True, slots=True)
class CallRow:
    """A tool call's ledger row, as the runtime reads it."""

    effect_key: str
    run_id: str
    thread_id: str
    step: int
    index: int
    call_id: str
    tool: str
    args: str
    status: CallStatus
    attempt: int
    calls_in_step: int = 1
    effect: Effect = "unguarded"
    queue: str | None = None
    dedup_window_ms: int | None = None
    finality: Finality | None = None
    #: (effect key, tool, queue) of the call after this one in the same reply, when read with it.
    next_call: tuple[str, str, str | None] | None = None
    first_started_at: datetime | None = None
    lease_expires_at: datetime | None = None
    result: str | None = None
    is_error: bool = False
    park_reason: str | None = None
    resolution: str | None = None
    resolved_by: str | None = None
    approved_by: str | None = None
    approved_args_hash: str | None = None
    original_args: str | None = None
    #: The index of the first call of this call's concurrent group, or None (runs in order).
    batch: int | None = None

    @property
    def is_last_in_step(self) -> bool:
        return self.index + 1 >= self.calls_in_step


@dataclass(frozen=True, slots=True)
class PermissionGrant:
    """A remembered decision: a person chose "always allow ``tool`` on this thread"."""

    thread_id: str
    tool: str
    granted_by: str
    granted_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """An intent to publish one task, committed with the transition that caused it."""

    key: str
    task: str
    args: tuple[Any, ...] = ()
    queue: str | None = None
    argsrepr: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Set (never stored) on what the reconcile backbone re-dispatches from a dead worker, so
    #: that it is published ahead of the work waiting in the queue (backbone.message_priority).
    recovered: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a thread's event log: ``seq`` counts from 1 per thread, in commit order."""

    thread_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    run_id: str | None = None
    created_at: datetime | None = None
