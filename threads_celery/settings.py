"""Configuration, from keyword arguments or ``THREADS_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from threads_celery.celery_settings import user_celery_settings
from threads_celery.decisions.deploys import AUTO_VERSION, check_version_name
from threads_celery.decisions.provider_limits import (
    DEFAULT_RETRY_FOR_S,
    RATE_LIMITS_VARIABLE,
    RETRY_FOR_VARIABLE,
    RateLimit,
    rate_limits_from_json,
    retry_for_from_env,
)
from threads_celery.decisions.retention import RETENTION_VARIABLE, RetentionPolicy
from threads_celery.decisions.usage import PRICES_VARIABLE, Prices
from threads_celery.exceptions import ConfigError

DEFAULT_BROKER_VISIBILITY_TIMEOUT_S = 3600
DEFAULT_FILES_ROOT = ".threads-celery/files"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, not {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, *, zero: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
    if value < 0 or (value == 0 and not zero) or value != value:
        raise ConfigError(f"{name} must be {'zero or more' if zero else 'positive'}, not {value}")
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise ConfigError(f"{name} must be true or false, not {raw!r}")


@dataclass(frozen=True)
class Settings:
    """Everything tunable. Leases are how long a silent worker is presumed alive."""

    database_url: str | None = None
    broker_url: str | None = None
    agents: tuple[str, ...] = ()
    step_lease_s: float = 60.0
    tool_lease_s: float = 300.0
    max_message_bytes: int = 1_000_000
    model_retries: int = 3
    # A step or tool task that fails unforeseen this many times in a row ends its run (error).
    max_task_failures: int = 3
    # A tool result over this many bytes (UTF-8) is shown to the model shortened, kept whole.
    max_tool_result_bytes: int = 100_000
    # Celery: a task must end well inside the broker's visibility timeout, or the broker
    # hands a still-running task to a second worker.
    visibility_timeout_s: int = DEFAULT_BROKER_VISIBILITY_TIMEOUT_S
    task_time_limit_s: int = 1800
    task_soft_time_limit_s: int = 1740
    outbox_stale_after_s: float = 10.0
    reconcile_interval_s: float = 5.0
    # THREADS_TASK_EVENTS: whether workers send task events from their start and publishers send
    # task-sent events. Off: each event is one more publish per task, a third of a bare task's CPU
    # (bench/celery_config_cost.py), and Flower turns workers' events on itself while it runs.
    task_events: bool = False
    # Whether the backbone's own tasks (reconcile ticks, scheduled-run starts, finish deliveries)
    # send task events: off, so Flower and other monitors list the agents' work.
    control_task_events: bool = False
    # THREADS_CAPTURE_OUTPUT: whether a worker's pool process passes its file descriptors 1 and 2
    # through redaction (os.write and subprocess output of tools; worker/output_capture.py).
    capture_output: bool = True
    # THREADS_LIVE_DELTAS: whether workers publish a streaming model step's deltas on the broker
    # (threads_celery/live/) and nudge a thread's subscribers after a commit.
    live_deltas: bool = True
    # THREADS_LIVE_COALESCE_MS: a step's fragments that come within this many ms of its last
    # message go out together (fewer messages, less worker CPU; that much more latency at most).
    live_coalesce_ms: float = 5.0
    # THREADS_FLUSH_EVERY_COMMIT: whether every commit on PostgreSQL waits for its WAL to reach
    # disk. Off: a model step's claim, a read_only call's result and a tool_call_started event
    # return before (a crash of PostgreSQL that takes one back costs a repetition, no more;
    # docs/production.md, "What waits for the disk").
    flush_every_commit: bool = False
    # Concurrent read_only calls of one model reply running at once (as parallel tasks).
    max_parallel_tool_calls: int = 8
    # Each thread's attachments live in <files_root>/<thread_id>/ (relative: to the worker's cwd).
    files_root: str = DEFAULT_FILES_ROOT
    # ctx.files quotas per thread: total bytes and number of files (0: no limit).
    files_max_bytes: int = 100 * 2**20
    files_max_count: int = 1000
    # ctx.run_code defaults: wall-clock seconds, memory cap, bytes kept of stdout and of stderr.
    code_timeout_s: float = 10.0
    code_memory_mb: int = 256
    code_max_output_bytes: int = 1_000_000
    # THREADS_SANDBOX_CGROUP: where each run_code call's cgroup (memory and task caps) is made:
    # auto, v2, v1, or the absolute path of a delegated cgroup v2 directory (workspace/cgroups.py).
    sandbox_cgroup: str = "auto"
    extra_celery: dict[str, Any] = field(default_factory=dict)
    # THREADS_MODEL_PRICES: what a million input and output tokens cost, per model (usage.py).
    model_prices: Prices = field(default_factory=lambda: Prices({}))
    # THREADS_RATE_LIMITS: requests and tokens per minute per provider, for the whole fleet.
    rate_limits: dict[str, RateLimit] = field(default_factory=dict)
    # THREADS_PROVIDER_RETRY_FOR_S: how long a step waits out a provider's 429s and 5xx.
    provider_retry_for_s: float = DEFAULT_RETRY_FOR_S
    # THREADS_DATABASE_STARTUP_WAIT_S: how long a starting worker or Beat waits for a database that
    # does not answer (a restart, a failover) before it refuses to start; 0 refuses at once.
    database_startup_wait_s: float = 60.0
    # THREADS_RABBITMQ_QUEUE_TYPE: on RabbitMQ, quorum queues (kept through a broker restart,
    # replicated in a cluster) or classic ones (what a deployment made before quorum declared).
    rabbitmq_queue_type: str = "quorum"
    # THREADS_DEPLOY_VERSION: the deployment version of this worker's code (None: versions are not
    # in use, work goes to queue ``threads``); ``auto`` derives it from the agents' config hashes.
    # A worker of version V consumes ``threads@V`` (see threads_celery.decisions.deploys).
    deploy_version: str | None = None
    # THREADS_DEPLOY_HEARTBEAT_S: how often a versioned worker records that it is alive.
    deploy_heartbeat_s: float = 5.0
    # THREADS_DEPLOY_LIVENESS_S: a version with no worker seen for this long has no live worker;
    # its unfinished runs are flagged stranded (deploy status, the console, metrics).
    deploy_liveness_s: float = 30.0
    # THREADS_RETENTION: how long finished threads are kept, and what the sweep does with them
    # (decisions/retention.py); the default keeps everything.
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    # THREADS_RETENTION_INTERVAL_S: how often Beat starts a retention sweep (when a policy is set).
    retention_interval_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.task_time_limit_s >= self.visibility_timeout_s:
            raise ConfigError(
                f"task time limit ({self.task_time_limit_s}s) must be below the broker's "
                f"visibility timeout ({self.visibility_timeout_s}s)"
            )
        if self.task_soft_time_limit_s >= self.task_time_limit_s:
            raise ConfigError("the soft time limit must be below the hard time limit")
        for name in ("files_max_bytes", "files_max_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer (0: no limit), not {value!r}")
        if self.sandbox_cgroup not in ("auto", "v1", "v2") and not self.sandbox_cgroup.startswith("/"):
            raise ConfigError(
                f"THREADS_SANDBOX_CGROUP must be auto, v1, v2 or an absolute path, not {self.sandbox_cgroup!r}"
            )
        if self.rabbitmq_queue_type not in ("quorum", "classic"):
            raise ConfigError(
                f"THREADS_RABBITMQ_QUEUE_TYPE must be quorum or classic, not {self.rabbitmq_queue_type!r}"
            )
        if self.deploy_version is not None and self.deploy_version != AUTO_VERSION:
            refused = check_version_name(self.deploy_version)
            if refused is not None:
                raise ConfigError(f"THREADS_DEPLOY_VERSION: {refused}")
        if (
            isinstance(self.max_parallel_tool_calls, bool)
            or not isinstance(self.max_parallel_tool_calls, int)
            or self.max_parallel_tool_calls < 1
        ):
            raise ConfigError(
                f"max_parallel_tool_calls must be a positive integer, not {self.max_parallel_tool_calls!r}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``THREADS_*`` variables, then keyword overrides (None is ignored)."""
        env = os.environ if env is None else env
        agents = tuple(s.strip() for s in env.get("THREADS_AGENTS", "").split(",") if s.strip())
        visibility = _int(env, "THREADS_VISIBILITY_TIMEOUT_S", DEFAULT_BROKER_VISIBILITY_TIMEOUT_S)
        hard = _int(env, "THREADS_TASK_TIME_LIMIT_S", min(1800, visibility // 2))
        values: dict[str, Any] = {
            "database_url": env.get("THREADS_DATABASE_URL") or None,
            "broker_url": env.get("THREADS_BROKER_URL") or None,
            "agents": agents,
            "step_lease_s": _float(env, "THREADS_STEP_LEASE_S", 60.0),
            "tool_lease_s": _float(env, "THREADS_TOOL_LEASE_S", 300.0),
            "max_message_bytes": _int(env, "THREADS_MAX_MESSAGE_BYTES", 1_000_000),
            "max_task_failures": _int(env, "THREADS_MAX_TASK_FAILURES", 3),
            "max_tool_result_bytes": _int(env, "THREADS_MAX_TOOL_RESULT_BYTES", 100_000),
            "visibility_timeout_s": visibility,
            "task_time_limit_s": hard,
            # A minute of warning before the hard limit, or a tenth of it for short limits
            # (a bare "hard - 60" left a one-second soft limit under a 60 s hard limit).
            "task_soft_time_limit_s": _int(
                env, "THREADS_TASK_SOFT_TIME_LIMIT_S", max(1, hard - max(1, min(60, hard // 10)))
            ),
            "outbox_stale_after_s": _float(env, "THREADS_OUTBOX_STALE_AFTER_S", 10.0),
            "reconcile_interval_s": _float(env, "THREADS_RECONCILE_INTERVAL_S", 5.0),
            "database_startup_wait_s": _float(env, "THREADS_DATABASE_STARTUP_WAIT_S", 60.0, zero=True),
            "rabbitmq_queue_type": env.get("THREADS_RABBITMQ_QUEUE_TYPE", "").strip().lower() or "quorum",
            "task_events": _bool(env, "THREADS_TASK_EVENTS", False),
            "control_task_events": _bool(env, "THREADS_CONTROL_TASK_EVENTS", False),
            "capture_output": _bool(env, "THREADS_CAPTURE_OUTPUT", True),
            "live_deltas": _bool(env, "THREADS_LIVE_DELTAS", True),
            "live_coalesce_ms": _float(env, "THREADS_LIVE_COALESCE_MS", 5.0),
            "flush_every_commit": _bool(env, "THREADS_FLUSH_EVERY_COMMIT", False),
            "max_parallel_tool_calls": _int(env, "THREADS_MAX_PARALLEL_TOOL_CALLS", 8),
            "files_root": env.get("THREADS_FILES_ROOT") or DEFAULT_FILES_ROOT,
            "files_max_bytes": _int(env, "THREADS_FILES_MAX_BYTES", 100 * 2**20),
            "files_max_count": _int(env, "THREADS_FILES_MAX_COUNT", 1000),
            "code_timeout_s": _float(env, "THREADS_CODE_TIMEOUT_S", 10.0),
            "code_memory_mb": _int(env, "THREADS_CODE_MEMORY_MB", 256),
            "code_max_output_bytes": _int(env, "THREADS_CODE_MAX_OUTPUT_BYTES", 1_000_000),
            "sandbox_cgroup": env.get("THREADS_SANDBOX_CGROUP", "").strip() or "auto",
            # THREADS_CELERY_CONFIG (a module or object) and THREADS_CELERY_<SETTING> variables.
            "extra_celery": user_celery_settings(env),
            "model_prices": Prices.from_json(env.get(PRICES_VARIABLE, "")),
            "rate_limits": rate_limits_from_json(env.get(RATE_LIMITS_VARIABLE, "")),
            "provider_retry_for_s": retry_for_from_env(env.get(RETRY_FOR_VARIABLE)),
            "deploy_version": env.get("THREADS_DEPLOY_VERSION", "").strip() or None,
            "deploy_heartbeat_s": _float(env, "THREADS_DEPLOY_HEARTBEAT_S", 5.0),
            "deploy_liveness_s": _float(env, "THREADS_DEPLOY_LIVENESS_S", 30.0),
            "retention": RetentionPolicy.from_json(env.get(RETENTION_VARIABLE, "")),
            "retention_interval_s": _float(env, "THREADS_RETENTION_INTERVAL_S", 3600.0),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
