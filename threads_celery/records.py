"""Frozen domain values: what the store hands out. Rows never leave the store package.

Everything the ledger returns is one of these plain values (or a builtin): runs, threads, calls,
messages, events, agent-tool runs, usage totals; and the one rule for the text it can hold
(:func:`storable_text`). They import nothing of the package but this module, so the store, the
pure decisions, the definitions and every face can share them without an import cycle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias, TypedDict

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

#: A call in one of these has not settled: it waits to run, or it runs.
UNSETTLED_STATUSES: tuple[CallStatus, ...] = ("pending", "started")

Effect: TypeAlias = Literal["read_only", "idempotent", "reconcilable", "unguarded"]
"""What a tool's call does to the outside world; decides what happens after an interruption
(see :mod:`threads_celery.decisions.effects`)."""

Finality: TypeAlias = Literal["final", "nonfinal"]
"""Whether a reconcile lookup's not-found answer proves the call never happened ("final")."""


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


#: A tool result's ``kind``: what the content stands for, beyond text (None: text as returned).
RESULT_KINDS = ("json", "retry", "invalid", "content")


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the model sees for one call: ``content`` is text, ``is_error`` marks a failure.

    ``kind`` says what the text stands for: ``"json"``, a value the tool returned (not a string),
    rendered as JSON (an agent adapted from Pydantic AI gives its model the value itself, as
    Pydantic AI does; others the JSON text); ``"retry"``, the tool asked
    the model to try again (Pydantic AI's ``ModelRetry``); ``"invalid"``, the arguments did not
    validate. Both are shown to the model as Pydantic AI shows a retried call. ``"content"``, the
    JSON of content that holds files (an MCP tool's image, say; see
    :class:`~threads_celery.definitions.tools.ToolContent`), given to the model as those parts.
    """

    call_id: str
    name: str
    content: str
    is_error: bool = False
    kind: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "call_id": self.call_id,
            "name": self.name,
            "content": self.content,
            "is_error": self.is_error,
        }
        if self.kind is not None:
            data["kind"] = self.kind
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        return cls(
            call_id=data["call_id"],
            name=data["name"],
            content=data["content"],
            is_error=bool(data.get("is_error", False)),
            kind=data.get("kind") if data.get("kind") in RESULT_KINDS else None,
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
    #: The branch that left this message behind (see :class:`Branch`); None on the current branch.
    superseded_by: int | None = None


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread's own row: the conversation a run drives, as the ledger keeps it."""

    id: str
    agent: str
    config_hash: str
    parent_thread_id: str | None = None
    #: The run that drives the thread now; None when it is idle (runs queue behind it).
    active_run_id: str | None = None
    #: The last event sequence number handed out on the thread.
    event_seq: int = 0
    created_at: datetime | None = None
    tenant: str = DEFAULT_TENANT
    #: The thread's current branch (:attr:`Branch.id`); None for a thread never rewound or forked.
    branch: int | None = None


#: How a branch began: ``rewind``, ``regenerate`` and ``edit`` in place; ``fork`` on a new thread.
BranchKind = Literal["rewind", "regenerate", "edit", "fork"]


@dataclass(frozen=True, slots=True)
class PriorEffect:
    """A call of the history a branch left behind whose effect may have happened.

    An ``unguarded`` or ``reconcilable`` call that was claimed (it ran, or may have): the branch
    asks a person before its tool is called again, since the effect is not undone by the rewind.
    """

    effect_key: str
    tool: str
    effect: str
    status: str

    def to_json(self) -> dict[str, str]:
        return {"effect_key": self.effect_key, "tool": self.tool, "effect": self.effect, "status": self.status}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PriorEffect:
        return cls(
            effect_key=str(data["effect_key"]), tool=str(data["tool"]), effect=str(data["effect"]),
            status=str(data["status"]),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Branch:
    """One branch of a thread's history: where it began and what it left behind.

    ``from_seq``: the first message superseded in place (None: none was). A fork's history is a
    copy of ``source_thread_id``'s through ``source_seq``. ``dropped_calls``: the calls that had no
    result at the branch point, left out of the new branch's history instead of copied as pending.
    """

    id: int
    thread_id: str
    kind: BranchKind
    created_at: datetime
    from_seq: int | None = None
    source_thread_id: str | None = None
    source_seq: int | None = None
    prior_effects: tuple[PriorEffect, ...] = ()
    dropped_calls: tuple[str, ...] = ()
    inherit_grants: bool = False
    created_by: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A snapshot of one run: one user message driven to an answer.

    The snapshots a worker's hot path reads (a tool call's delivery, a model step's claim) leave
    out ``input``, ``output`` and ``error`` (read as ``""`` and None): neither reads them, and they
    grow with the prompt and the answer. Read the run again for them.
    """

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
    #: The step whose worker process was last lost running it, and how many times in a row.
    lost_step: int | None = None
    lost_times: int = 0
    #: The step whose attempts were voided after they may have reached the provider, and how many.
    voided_step: int | None = None
    voided_requests: int = 0
    #: The deployment version the run is on (None: not placed yet, or versions not in use), its
    #: policy (``pinned`` or ``upgrade``), and why an upgrade to ``deploy_checked`` left it pinned.
    deploy_version: str | None = None
    deploy_policy: str | None = None
    deploy_pin_reason: str | None = None
    deploy_checked: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def voided(self, step: int) -> int:
        """The voided attempts of model ``step`` this row records (its count is another step's, else)."""
        return self.voided_requests if self.voided_step == step else 0

    def voided_after_claim(self, step: int) -> int:
        """The voided attempts of ``step`` once a claim of it commits, this row being the run as the
        claim found it. A lease still named on it (expired: the claim could not have taken it
        else) is an attempt of the step that neither committed nor gave its lease back: its worker
        died or stalled past the lease, after its request may have reached the provider. The claim
        counts it; the store's claim statements write the same count."""
        return self.voided(step) + (1 if self.lease_owner is not None else 0)


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
    #: The call before this one in its reply waits to run or is running (read with it).
    previous_unsettled: bool = False
    #: How many times the worker process running the call was lost.
    lost_times: int = 0

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
    #: Never stored: a task of the project's (a run's finish callback, see
    #: :mod:`threads_celery.transitions.finish_callbacks`), sent with these keyword arguments to
    #: its own ``queue`` or, without one, where the app's routes send it.
    kwargs: dict[str, Any] | None = None
    user_task: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a thread's event log: ``seq`` counts from 1 per thread, in commit order."""

    thread_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    run_id: str | None = None
    created_at: datetime | None = None


# -- agent-tool runs ----------------------------------------------------------------------------

#: The statuses an agent-tool run can have.
AGENT_TOOL_STATUSES = ("starting", "running", "completed", "error", "aborted", "interrupted")
#: The ends nothing overrides; "interrupted" is softer (the child may still finish and say so).
AGENT_TOOL_HARD_TERMINAL = frozenset({"completed", "error", "aborted"})


class MilestoneOptions(TypedDict):
    """How a detached run's milestones surface in the parent thread, as stored with the run."""

    names: list[str]
    mode: Literal["narrate", "react"]


@dataclass(frozen=True, slots=True)
class Milestone:
    """A named point a detached child reported reaching, numbered from 0 per agent-tool run."""

    sequence: int
    name: str
    data: Any = None
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class AgentToolFailure:
    """What a parent sees when a child run did not complete."""

    status: Literal["error", "aborted", "interrupted"]
    error: str
    retryable: bool
    reason: str | None = None
    child_still_running: bool | None = None
    ok: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ok": False, "status": self.status, "error": self.error, "retryable": self.retryable}
        if self.reason is not None:
            data["reason"] = self.reason
        if self.child_still_running is not None:
            data["child_still_running"] = self.child_still_running
        return data


@dataclass(frozen=True, slots=True)
class AgentToolResult:
    """A completed child run: its summary (last assistant text, possibly empty) and output."""

    run_id: str
    summary: str
    output: Any = None
    ok: bool = True
    status: str = "completed"


@dataclass(frozen=True, slots=True)
class AgentToolRun:
    """A snapshot of one agent-tool run, as the parent's registry keeps it."""

    run_id: str
    parent_thread_id: str
    agent_type: str
    status: str
    parent_run_id: str | None = None
    parent_tool_call_id: str | None = None
    parent_effect_key: str | None = None
    display_order: int = 0
    display_name: str | None = None
    child_thread_id: str | None = None
    child_run_id: str | None = None
    input: Any = None
    input_preview: str = ""
    reason: str | None = None
    child_still_running: bool | None = None
    error: str | None = None
    summary: str | None = None
    output: Any = None
    progress: dict[str, Any] | None = None
    last_signal_at: datetime | None = None
    detached: bool = False
    event_delivery: str = "all"
    on_finish: str | None = None
    notify: Mapping[str, str] | None = None
    on_milestones: MilestoneOptions | None = None
    max_budget_ms: int | None = None
    no_progress_budget_ms: int | None = None
    delivered: tuple[str, ...] = ()
    delivery_attempts: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    milestones: tuple[Milestone, ...] = field(default=())

    @property
    def is_terminal(self) -> bool:
        return self.status in AGENT_TOOL_HARD_TERMINAL or self.status == "interrupted"

    def result(self) -> AgentToolResult | AgentToolFailure | None:
        """The result a parent sees, or None while the run goes on."""
        if self.status == "completed":
            return AgentToolResult(run_id=self.run_id, summary=self.summary or "", output=self.output)
        if self.status == "error":
            return AgentToolFailure("error", self.error or "agent tool run failed", retryable=False)
        if self.status == "aborted":
            return AgentToolFailure("aborted", self.error or "agent tool run was cancelled", retryable=False)
        if self.status == "interrupted":
            return AgentToolFailure(
                "interrupted",
                self.error or "agent tool run was interrupted",
                retryable=True,
                reason=self.reason,
                child_still_running=self.child_still_running,
            )
        return None


# -- usage and metrics --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallTimelineEntry:
    """A tool call as an operator's timeline shows it: its times, state and a preview of its result.

    ``args`` and ``result_preview`` hold at most the first characters of the arguments and of the
    whole result (the kept ``full_result`` when the model was shown it shortened); ``args_chars``
    and ``result_chars`` are their whole lengths.
    """

    effect_key: str
    run_id: str
    step: int
    index: int
    tool: str
    args: str
    effect: str
    status: str
    attempt: int
    created_at: datetime | None = None
    first_started_at: datetime | None = None
    finished_at: datetime | None = None
    is_error: bool = False
    park_reason: str | None = None
    resolution: str | None = None
    resolved_by: str | None = None
    approved_by: str | None = None
    result_preview: str | None = None
    result_chars: int = 0
    args_chars: int = 0


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """One model call that returned (a committed step): when it was committed and what it used."""

    run_id: str
    step: int
    model: str
    requests: int
    input_tokens: int
    output_tokens: int
    cost: float | None = None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Summed usage: requests, input and output tokens, and cost (None: no priced call)."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, int | float | None]:
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "cost": self.cost,
        }


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What the ledger holds, counted at one moment (the Prometheus gauges)."""

    runs_by_status: dict[str, int]
    parked_calls: int
    outbox_depth: int
    reconcile_lag_s: float


# -- what text the ledger holds (see threads_celery.store.storable) --------------------------------

#: A character the ledger cannot hold: NUL, or any surrogate (Python strings hold only unpaired ones).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """``text`` with every NUL and unpaired surrogate replaced by U+FFFD."""
    if text.isascii() and "\x00" not in text:
        return text
    return UNSTORABLE.sub(REPLACEMENT, text)


def storable(value: Any) -> Any:
    """``value`` (a JSON-like structure) with :func:`storable_text` applied to every string, keys too."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class DeployVersion:
    """A deployment version as the ledger records it (see :mod:`threads_celery.decisions.deploys`)."""

    version: str
    #: ``current`` (new runs start on it), ``ramping`` (a share of new runs does) or None.
    role: str | None = None
    ramp_percent: int = 0
    #: The agents' config hashes of the version, as its first worker registered them.
    agents: dict[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    promoted_at: datetime | None = None
    retired_at: datetime | None = None
