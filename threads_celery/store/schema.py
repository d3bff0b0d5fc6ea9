"""The ledger's tables (SQLAlchemy Core). Alembic migrations are held against this metadata.

Conversation history is rows, never one growing blob, and never travels through the broker.
Timestamps are stored as UTC; SQLite gets naive UTC text that sorts the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


#: Thread and run ids: 255 characters hold a tenant's scoped id (``<tenant>~<id>``, see
#: threads_celery.api.tenancy). SQLite does not enforce the length; its tables keep the
#: VARCHAR(64) they were created with (migration 0008 explains why).
Id = String(255).with_variant(String(64), "sqlite")

agents = Table(
    "agents",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("config_hash", String(64), nullable=False),
    Column("description", JSON, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

threads = Table(
    "threads",
    metadata,
    Column("id", Id, primary_key=True),
    Column("agent", String(128), nullable=False),
    Column("config_hash", String(64), nullable=False),
    Column("parent_thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), nullable=True),
    # The run that drives this thread now; NULL when idle. Runs queue behind it.
    Column("active_run_id", Id, nullable=True),
    # The last event sequence handed out; bumping it serialises a thread's events in commit order.
    Column("event_seq", BigInteger, nullable=False, default=0),
    Column("created_at", UTCDateTime, nullable=False),
    # Who owns the thread in the HTTP API (a token's tenant); child threads inherit their parent's.
    Column("tenant", String(128), nullable=False, default="default", server_default="default"),
    # The thread's current branch (``branches.id``); NULL for a thread never rewound or forked.
    Column("branch", BigInteger, nullable=True),
    Index(None, "parent_thread_id"),
    Index(None, "tenant"),
)

messages = Table(
    "messages",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("run_id", Id, nullable=True),
    Column("role", String(16), nullable=False),
    Column("text", Text, nullable=False, default=""),
    Column("parts", JSON, nullable=True),
    # Where an injected message came from: {source, run_id, agent_type, status}.
    Column("meta", JSON, nullable=True),
    # A deterministic key for injected messages, so a redelivery never adds one twice.
    Column("key", String(255), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # The branch (``branches.id``) that left this message behind (a rewind, a regenerate or an
    # edit); NULL while it is on the thread's current branch. Superseded messages are kept.
    Column("superseded_by", BigInteger, nullable=True),
    UniqueConstraint("thread_id", "seq"),
    UniqueConstraint("thread_id", "key"),
)

events = Table(
    "events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), nullable=False),
    # Contiguous per thread from 1, in commit order: the replay cursor (SSE Last-Event-ID).
    Column("seq", BigInteger, nullable=False),
    Column("run_id", Id, nullable=True),
    Column("type", String(64), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("thread_id", "seq"),
)

runs = Table(
    "runs",
    metadata,
    Column("id", Id, primary_key=True),
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), nullable=False),
    Column("agent", String(128), nullable=False),
    Column("status", String(32), nullable=False),
    Column("input", Text, nullable=False),
    Column("input_meta", JSON, nullable=True),
    # Set when this run is the child of an agent-tool run.
    Column("agent_tool_run_id", String(255), nullable=True),
    # The number of the next model step; the tool calls of step n run while step == n + 1.
    Column("step", Integer, nullable=False, default=0),
    # Bumped by every claim and every commit; each write is conditional on it.
    Column("fence", BigInteger, nullable=False, default=0),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
    # The W3C traceparent of the run's span: every task of the run opens its spans under it.
    Column("traceparent", String(64), nullable=True),
    # The step whose worker process was last lost running it, and how many times (migration 0011).
    Column("lost_step", Integer, nullable=True),
    Column("lost_times", Integer, nullable=False, default=0, server_default="0"),
    # The step whose attempts were voided after they may have reached the provider (a worker
    # that died or lost its lease holding the step, a reply that could not be stored), and how
    # many: the provider billed them, so the step's usage counts them (migration 0012).
    Column("voided_step", Integer, nullable=True),
    Column("voided_requests", Integer, nullable=False, default=0, server_default="0"),
    # The deployment version the run is on (migration 0013): set at its first step, changed only
    # by an upgrade; NULL while versions are not in use. Its policy (pinned or upgrade), why an
    # upgrade left it pinned, and the version that check was against.
    Column("deploy_version", String(64), nullable=True),
    Column("deploy_policy", String(16), nullable=True),
    Column("deploy_pin_reason", Text, nullable=True),
    Column("deploy_checked", String(64), nullable=True),
    Index(None, "thread_id", "created_at"),
    Index(None, "status", "lease_expires_at"),
    # The console's run list: newest first, by agent or status (migration 0009).
    Index(None, "created_at", "id"),
    Index(None, "agent", "created_at"),
    Index(None, "status", "created_at"),
    Index(None, "deploy_version", "status"),
)

tool_calls = Table(
    "tool_calls",
    metadata,
    Column("effect_key", String(255), primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("thread_id", Id, nullable=False),
    Column("step", Integer, nullable=False),
    Column("idx", Integer, nullable=False),
    # How many calls the model asked for in this step: the last one hands over to the next step.
    Column("calls_in_step", Integer, nullable=False),
    Column("call_id", String(255), nullable=False),
    Column("tool", String(255), nullable=False),
    Column("args", Text, nullable=False),
    Column("args_hash", String(64), nullable=False),
    Column("effect", String(32), nullable=False),
    # Pinned when the call was recorded: a deploy that changes the tool does not change them.
    Column("dedup_window_ms", BigInteger, nullable=True),
    Column("finality", String(16), nullable=True),
    Column("queue", String(255), nullable=True),
    Column("status", String(32), nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("first_started_at", UTCDateTime, nullable=True),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    Column("result", Text, nullable=True),
    Column("is_error", Boolean, nullable=False, default=False),
    Column("park_reason", Text, nullable=True),
    # How a person settled a parked call: assume_done / assume_not_done, and who.
    Column("resolution", String(32), nullable=True),
    Column("resolved_by", String(255), nullable=True),
    Column("resolved_at", UTCDateTime, nullable=True),
    # Approval: bound to the exact arguments it was given for (their hash).
    Column("approved_by", String(255), nullable=True),
    Column("approved_at", UTCDateTime, nullable=True),
    Column("approved_args_hash", String(64), nullable=True),
    Column("original_args", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime, nullable=True),
    # The index of the first call of the concurrent group this call runs in (None: in order).
    Column("batch", Integer, nullable=True),
    # A result over the size limit is shown to the model shortened (in ``result``) and kept
    # whole here, for the user (Threads.tool_result, GET /v1/calls/{effect_key}/result).
    Column("full_result", Text, nullable=True),
    # How many times the worker process running the call was lost (migration 0011).
    Column("lost_times", Integer, nullable=False, default=0, server_default="0"),
    UniqueConstraint("run_id", "step", "idx"),
    Index(None, "status", "lease_expires_at"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("task", String(128), nullable=False),
    Column("args", JSON, nullable=False),
    Column("queue", String(255), nullable=True),
    Column("argsrepr", String(512), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # When the row counts as lost if it is still here: the backbone publishes it again then and
    # moves this forward. The fast path publishes right after commit without writing.
    Column("due_at", UTCDateTime, nullable=False),
    Column("publish_count", Integer, nullable=False, default=0),
    Index(None, "due_at"),
)


agent_tool_runs = Table(
    "agent_tool_runs",
    metadata,
    Column("run_id", String(255), primary_key=True),
    Column("parent_thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), nullable=False),
    Column("parent_run_id", Id, nullable=True),
    Column("parent_tool_call_id", String(255), nullable=True),
    # The parent's tool call this run answers, when a model call started it (awaited).
    Column("parent_effect_key", String(255), nullable=True),
    Column("agent_type", String(128), nullable=False),
    Column("display_order", Integer, nullable=False, default=0),
    Column("display_name", String(255), nullable=True),
    Column("child_thread_id", Id, nullable=True),
    Column("child_run_id", Id, nullable=True, unique=True),
    Column("input", JSON, nullable=True),
    Column("input_preview", Text, nullable=False, default=""),
    Column("status", String(32), nullable=False),
    Column("reason", String(64), nullable=True),
    Column("child_still_running", Boolean, nullable=True),
    Column("error", Text, nullable=True),
    Column("summary", Text, nullable=True),
    Column("output", JSON, nullable=True),
    Column("progress", JSON, nullable=True),
    Column("last_signal_at", UTCDateTime, nullable=True),
    Column("detached", Boolean, nullable=False, default=False),
    Column("event_delivery", String(16), nullable=False, default="all"),
    Column("on_finish", String(255), nullable=True),
    Column("notify", JSON, nullable=True),
    Column("on_milestones", JSON, nullable=True),
    Column("max_budget_ms", BigInteger, nullable=True),
    Column("no_progress_budget_ms", BigInteger, nullable=True),
    # When the backbone must look at this run next (a budget ends, silence runs out); NULL: never.
    Column("check_at", UTCDateTime, nullable=True),
    # Finish delivery: statuses delivered, and a claim so two deliveries fire once.
    Column("delivered", JSON, nullable=False, default=list),
    Column("delivery_owner", String(255), nullable=True),
    Column("delivery_lease_until", UTCDateTime, nullable=True),
    Column("delivery_attempts", Integer, nullable=False, default=0),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Index(None, "parent_thread_id", "created_at"),
    Index(None, "check_at"),
)

milestones = Table(
    "milestones",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("agent_tool_run_id", String(255), ForeignKey("agent_tool_runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("name", String(255), nullable=False),
    Column("data", JSON, nullable=True),
    Column("at", UTCDateTime, nullable=False),
    UniqueConstraint("agent_tool_run_id", "sequence"),
)


variables = Table(
    "variables",
    metadata,
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("type", String(16), nullable=False),
    # Text in clear; a secret as a Fernet token (THREADS_SECRET_KEY), never in clear.
    Column("value", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)


# One row per model call that returned (the step's committed reply): what it used and cost.
# Read back as sums per run, per thread and per agent over a day (usage limits, reports).
model_usage = Table(
    "model_usage",
    metadata,
    Column("run_id", Id, primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("thread_id", Id, nullable=False),
    Column("agent", String(128), nullable=False),
    Column("model", String(255), nullable=False),
    Column("requests", Integer, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    # In the price table's currency; NULL when the model has no configured price.
    Column("cost", Float, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Index(None, "thread_id"),
    Index(None, "agent", "created_at"),
)

# "Always allow this tool on this thread": a person's remembered decision, checked after the
# agent's rules and before its mode.
permission_grants = Table(
    "permission_grants",
    metadata,
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True),
    Column("tool", String(255), primary_key=True),
    Column("granted_by", String(255), nullable=False),
    Column("granted_at", UTCDateTime, nullable=False),
)


# One row per branch of a thread's history: a rewind, regenerate or edit in place (the messages
# from ``from_seq`` on are superseded by it), or a fork (a new thread whose history is a copy of
# ``source_thread_id``'s up to ``source_seq``). Calls that may have had their effect in the
# history left behind are listed in ``prior_effects``: the branch asks before calling them again.
branches = Table(
    "branches",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("from_seq", Integer, nullable=True),
    Column("source_thread_id", Id, nullable=True),
    Column("source_seq", Integer, nullable=True),
    Column("prior_effects", JSON, nullable=False, default=list),
    Column("dropped_calls", JSON, nullable=False, default=list),
    Column("inherit_grants", Boolean, nullable=False, default=False),
    Column("created_by", String(255), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Index(None, "thread_id", "id"),
)


# Deployment versions (migration 0013): each version a worker registered, which one new runs start
# on (role ``current``), which one takes a share of them (``ramping``, ``ramp_percent``), and when
# one was retired (it takes no new work and is hidden from the status).
deploy_versions = Table(
    "deploy_versions",
    metadata,
    Column("version", String(64), primary_key=True),
    Column("role", String(16), nullable=True),
    Column("ramp_percent", Integer, nullable=False, default=0, server_default="0"),
    # The agents' config hashes of the version, as its first worker registered them.
    Column("agents", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("promoted_at", UTCDateTime, nullable=True),
    Column("retired_at", UTCDateTime, nullable=True),
)

# The workers of each version, as each records itself alive every THREADS_DEPLOY_HEARTBEAT_S.
deploy_workers = Table(
    "deploy_workers",
    metadata,
    Column("worker", String(255), primary_key=True),
    Column("version", String(64), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("seen_at", UTCDateTime, nullable=False),
    Index(None, "version"),
)

# Which version took each step and call of a run (``step:<run>:<n>`` or the call's effect key).
deploy_marks = Table(
    "deploy_marks",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("run_id", Id, nullable=False),
    Column("version", String(64), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Index(None, "run_id"),
)

# A thread that retention keeps whatever its policy says (a legal hold, a support case): the
# sweep and the prune command leave its whole tree alone (migration 0015). Erasure refuses it.
retention_holds = Table(
    "retention_holds",
    metadata,
    Column("thread_id", Id, ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True),
    Column("reason", Text, nullable=False),
    Column("held_by", String(255), nullable=False),
    Column("held_at", UTCDateTime, nullable=False),
)

# The range the retention sweep walks, oldest first, in bounded batches (migration 0015).
Index("ix_threads_created_at_id", threads.c.created_at, threads.c.id)
