"""Retention: how long a finished thread is kept, and what may never be touched. Pure functions.

A policy is a list of rules and a default. Each rule names what it applies to (final statuses,
an agent, a tenant; any left out match everything) and how long such a thread is kept after its
last activity (``keep``; None keeps it for good). The most specific rule that matches wins (the
one naming the most of status, agent and tenant; among equals the first listed), else the
default; a policy with no default keeps what no rule names. So "succeeded 7 days, failed 30
days, everything of tenant acme 1 year" is three rules, and a thread with no rule is never
pruned by accident.

Whatever the policy says, :func:`refusal` is checked first, by the sweep, by export and by
erasure alike: a thread (with the child threads of its agent tools) that has a run not finished,
or an ``unguarded`` or ``reconcilable`` call without an outcome (its effect may be happening, or
may have happened with nobody knowing yet), is never touched; a held thread is kept by
retention (erasure refuses it too: a hold is released by a person, never by a sweep).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal, Protocol

from threads_celery.exceptions import ConfigError

RETENTION_VARIABLE: Final = "THREADS_RETENTION"
"""The environment variable holding the policy as JSON (see :meth:`RetentionPolicy.from_json`)."""

#: Final run statuses a rule may name, and the two names for groups of them.
FINAL_STATUSES: Final = ("completed", "error", "aborted", "interrupted")
STATUS_GROUPS: Final[Mapping[str, tuple[str, ...]]] = {
    "succeeded": ("completed",),
    "failed": ("error", "aborted", "interrupted"),
}
#: What a thread whose runs never ended... has not: it is named by no status (only the default
#: or a rule without statuses applies to a thread without runs).
NO_RUN: Final = "none"

#: The effects whose call, without an outcome, may be doing or have done its side effect.
RISKY_EFFECTS: Final = ("unguarded", "reconcilable")
#: Call statuses without an outcome whose effect may have begun: claimed and running (or its
#: worker died: started), or parked for a person to say whether it happened. A call still
#: pending or awaiting an approval or a variable never began (its claim is committed before
#: ``execute``); while its run is unfinished, the run keeps the thread, and once the run has
#: ended it never will begin, so it does not keep the thread for good.
NO_OUTCOME_STATUSES: Final = ("started", "parked")

Action = Literal["delete", "archive"]
DEFAULT_BATCH_SIZE: Final = 200
DEFAULT_EVENTS_BATCH_SIZE: Final = 5000


class ThreadFacts(Protocol):
    """What the store knows of one root thread and the child threads under it."""

    @property
    def thread_id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def last_status(self) -> str | None:
        """The status of the root thread's latest run; None when it has none."""

    @property
    def last_activity(self) -> datetime:
        """When the tree last changed: its latest run's end (or start), else its creation."""

    @property
    def unfinished_runs(self) -> tuple[str, ...]:
        """Runs of the tree that are not in a terminal status."""

    @property
    def open_risky_calls(self) -> tuple[str, ...]:
        """Effect keys of the tree's unguarded or reconcilable calls that have no outcome."""

    @property
    def held(self) -> bool: ...


@dataclass(frozen=True)
class RetentionRule:
    """Keep threads that match for ``keep`` after their last activity (None: for good)."""

    keep: timedelta | None
    statuses: frozenset[str] | None = None
    agent: str | None = None
    tenant: str | None = None

    def matches(self, facts: ThreadFacts) -> bool:
        if self.statuses is not None and (facts.last_status or NO_RUN) not in self.statuses:
            return False
        if self.agent is not None and facts.agent != self.agent:
            return False
        return self.tenant is None or facts.tenant == self.tenant

    @property
    def specificity(self) -> int:
        return sum(part is not None for part in (self.statuses, self.agent, self.tenant))

    def describe(self) -> str:
        named = [
            f"status in {','.join(sorted(self.statuses))}" if self.statuses is not None else "",
            f"agent {self.agent}" if self.agent is not None else "",
            f"tenant {self.tenant}" if self.tenant is not None else "",
        ]
        scope = " and ".join(n for n in named if n) or "every thread"
        return f"{scope}: keep {_describe_keep(self.keep)}"


def _describe_keep(keep: timedelta | None) -> str:
    if keep is None:
        return "for good"
    days = keep / timedelta(days=1)
    return f"{days:g} days"


@dataclass(frozen=True)
class RetentionPolicy:
    """Rules, a default, and what the sweep does with an expired thread."""

    rules: tuple[RetentionRule, ...] = ()
    #: What no rule names is kept this long; None: for good.
    default_keep: timedelta | None = None
    action: Action = "delete"
    #: Where ``archive`` writes each thread (an fsspec URL: a directory, ``s3://bucket/prefix``).
    archive_url: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    #: The sweep says what it would prune and prunes nothing.
    dry_run: bool = False
    #: Seconds between one batch and the next (the worker publishes the next with this countdown):
    #: the sweep's share of the database, traded against how long a large prune takes.
    pause_s: float = 0.0
    #: Events (the replay log of event streams) older than this go, from every thread, in
    #: batches of ``events_batch_size``; None keeps them as long as their thread.
    events_keep: timedelta | None = None
    events_batch_size: int = DEFAULT_EVENTS_BATCH_SIZE
    #: fsspec's options for ``archive_url`` (an endpoint, a profile); never logged.
    archive_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.action not in ("delete", "archive"):
            raise ConfigError(f"retention action must be 'delete' or 'archive', not {self.action!r}")
        if self.action == "archive" and not self.archive_url:
            raise ConfigError("retention action 'archive' needs an archive_url (a directory or an fsspec URL)")
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or not 1 <= self.batch_size <= 10_000
        ):
            raise ConfigError(f"retention batch_size must be an integer in 1..10000, not {self.batch_size!r}")
        pause = self.pause_s
        if isinstance(pause, bool) or not isinstance(pause, int | float) or not 0 <= pause <= 3600:
            raise ConfigError(f"retention pause_s must be a number of seconds in 0..3600, not {pause!r}")
        size = self.events_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 100_000:
            raise ConfigError(f"retention events_batch_size must be an integer in 1..100000, not {size!r}")

    @property
    def enabled(self) -> bool:
        """Whether anything can ever expire under this policy."""
        return self.shortest_keep is not None or self.events_keep is not None

    @property
    def shortest_keep(self) -> timedelta | None:
        """The shortest finite keep: no thread younger than this can be due."""
        keeps = [r.keep for r in self.rules if r.keep is not None]
        if self.default_keep is not None:
            keeps.append(self.default_keep)
        return min(keeps) if keeps else None

    def rule_for(self, facts: ThreadFacts) -> RetentionRule | None:
        """The rule that applies to ``facts``: the most specific match, else None (the default)."""
        best: RetentionRule | None = None
        for rule in self.rules:
            if rule.matches(facts) and (best is None or rule.specificity > best.specificity):
                best = rule
        return best

    @classmethod
    def from_json(cls, raw: str) -> RetentionPolicy:
        """The policy of ``THREADS_RETENTION``, e.g.::

            {"rules": [{"status": "succeeded", "keep_days": 7},
                       {"status": "failed", "keep_days": 30},
                       {"tenant": "acme", "agent": "support", "keep_days": null}],
             "default_keep_days": 365, "action": "archive", "archive_url": "s3://bucket/threads"}

        An empty string is no retention (everything kept). Statuses are the final run statuses,
        ``succeeded`` (completed), ``failed`` (error, aborted, interrupted), or ``none`` (a
        thread without runs). A malformed policy is a ConfigError naming what is wrong.
        """
        if not raw.strip():
            return cls()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{RETENTION_VARIABLE} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{RETENTION_VARIABLE} must be a JSON object")
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RetentionPolicy:
        known = {
            "rules", "default_keep_days", "action", "archive_url", "archive_options", "batch_size", "dry_run",
            "events_keep_days", "events_batch_size", "pause_s",
        }  # fmt: skip
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"retention: unknown keys {unknown}; known: {sorted(known)}")
        rules_raw = data.get("rules", [])
        if not isinstance(rules_raw, list):
            raise ConfigError("retention: rules must be a list")
        dry_run = data.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ConfigError("retention: dry_run must be true or false")
        options = data.get("archive_options")
        if options is not None and not isinstance(options, dict):
            raise ConfigError("retention: archive_options must be an object (fsspec's storage options)")
        return cls(
            rules=tuple(_rule(r, i) for i, r in enumerate(rules_raw)),
            archive_options=options,
            default_keep=_keep(data.get("default_keep_days"), "default_keep_days"),
            action=data.get("action", "delete"),
            archive_url=data.get("archive_url"),
            batch_size=data.get("batch_size", DEFAULT_BATCH_SIZE),
            events_keep=_keep(data.get("events_keep_days"), "events_keep_days"),
            events_batch_size=data.get("events_batch_size", DEFAULT_EVENTS_BATCH_SIZE),
            pause_s=data.get("pause_s", 0.0),
            dry_run=dry_run,
        )


def _keep(raw: object, where: str) -> timedelta | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw or raw < 0:
        raise ConfigError(f"retention: {where} must be a number of days (0 or more) or null, not {raw!r}")
    return timedelta(days=raw)


def _statuses(raw: object, where: str) -> frozenset[str] | None:
    if raw is None:
        return None
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"retention: {where}.status must be a status or a list of them")
    out: set[str] = set()
    for name in names:
        if name in STATUS_GROUPS:
            out.update(STATUS_GROUPS[name])
        elif name in FINAL_STATUSES or name == NO_RUN:
            out.add(name)
        else:
            allowed = [*FINAL_STATUSES, *STATUS_GROUPS, NO_RUN]
            raise ConfigError(f"retention: {where}.status {name!r} is not one of {allowed}")
    return frozenset(out)


def _rule(raw: object, index: int) -> RetentionRule:
    where = f"rules[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"retention: {where} must be an object")
    unknown = sorted(set(raw) - {"status", "agent", "tenant", "keep_days"})
    if unknown:
        raise ConfigError(f"retention: {where} has unknown keys {unknown}")
    if "keep_days" not in raw:
        raise ConfigError(f"retention: {where} needs keep_days (a number of days, or null for good)")
    for key in ("agent", "tenant"):
        if raw.get(key) is not None and (not isinstance(raw[key], str) or not raw[key]):
            raise ConfigError(f"retention: {where}.{key} must be a non-empty string")
    return RetentionRule(
        keep=_keep(raw["keep_days"], f"{where}.keep_days"),
        statuses=_statuses(raw.get("status"), where),
        agent=raw.get("agent"),
        tenant=raw.get("tenant"),
    )


# -- decisions ---------------------------------------------------------------------------------


def refusal(facts: ThreadFacts) -> str | None:
    """Why nothing may touch this thread now (export, erasure, retention), or None."""
    if facts.unfinished_runs:
        runs = ", ".join(facts.unfinished_runs[:3]) + (" ..." if len(facts.unfinished_runs) > 3 else "")
        return f"thread {facts.thread_id} is running: run {runs} has not finished"
    if facts.open_risky_calls:
        key = facts.open_risky_calls[0]
        return (
            f"thread {facts.thread_id} has an unguarded or reconcilable call without an outcome "
            f"({key}): its side effect may be under way; settle it first"
        )
    return None


@dataclass(frozen=True)
class Keep:
    """Leave the thread; ``reason`` says why (a refusal, a hold, not due, no rule)."""

    thread_id: str
    reason: str


@dataclass(frozen=True)
class Prune:
    """Delete (or archive, then delete) the thread's tree; ``rule`` says which rule expired it."""

    thread_id: str
    action: Action
    rule: str
    expired_at: datetime


RetentionDecision = Keep | Prune


def retention_decision(facts: ThreadFacts, policy: RetentionPolicy, now: datetime) -> RetentionDecision:
    """What the sweep does with one root thread (its child threads go with it)."""
    refused = refusal(facts)
    if refused is not None:
        return Keep(facts.thread_id, refused)
    if facts.held:
        return Keep(facts.thread_id, f"thread {facts.thread_id} is held")
    rule = policy.rule_for(facts)
    keep = rule.keep if rule is not None else policy.default_keep
    described = rule.describe() if rule is not None else f"default: keep {_describe_keep(policy.default_keep)}"
    if keep is None:
        return Keep(facts.thread_id, f"kept for good ({described})")
    expires = facts.last_activity + keep
    if expires > now:
        return Keep(facts.thread_id, f"not due before {expires.isoformat()} ({described})")
    return Prune(facts.thread_id, policy.action, described, expires)


def sweep_decisions(
    batch: Sequence[ThreadFacts], policy: RetentionPolicy, now: datetime
) -> tuple[RetentionDecision, ...]:
    """The decisions of one batch, in the batch's order."""
    return tuple(retention_decision(facts, policy, now) for facts in batch)


__all__ = [
    "FINAL_STATUSES",
    "NO_OUTCOME_STATUSES",
    "RETENTION_VARIABLE",
    "RISKY_EFFECTS",
    "Keep",
    "Prune",
    "RetentionDecision",
    "RetentionPolicy",
    "RetentionRule",
    "ThreadFacts",
    "refusal",
    "retention_decision",
    "sweep_decisions",
]
