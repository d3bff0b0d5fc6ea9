"""Deploy versions: which code a run is on, and whether it may move. Pure functions, no I/O.

A durable run outlives the code that started it. A worker runs one *deployment version* (set
with ``THREADS_DEPLOY_VERSION``, or ``auto``: derived from its agents' config hashes) and
consumes the work queues of that version (``threads@v2``; an agent's ``email`` queue becomes
``email@v2``), plus the shared control queue. A run is placed on a version when its first step
is taken (the current one, or the ramping one for a share of new runs) and stays *pinned*
there: its steps and calls go only to workers of that version. An agent may declare
``versioning="upgrade"``: its runs then move to the current version at a step boundary, but only
after :func:`check_upgrade` found nothing that the new code would meet half done and not
understand. A run that fails the check stays pinned, with the reason.

With no version configured nothing here is used: the queue is ``threads`` as before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal, TypeAlias

from threads_celery.records import DeployVersion

__all__ = [
    "AUTO_VERSION",
    "VERSIONING_POLICIES",
    "Compatible",
    "Incompatible",
    "NotYet",
    "PendingCall",
    "TargetAgent",
    "TargetTool",
    "UpgradeDecision",
    "UpgradeSubject",
    "VersionState",
    "VersionStatus",
    "base_queue",
    "check_upgrade",
    "check_version_name",
    "choose_version",
    "derive_version",
    "ramp_bucket",
    "retire_refusal",
    "version_of_queue",
    "version_statuses",
    "versioned_queue",
]

#: ``THREADS_DEPLOY_VERSION=auto``: the version is derived from the agents' config hashes.
AUTO_VERSION: Final = "auto"
#: What separates a work queue from the version whose workers consume it (``threads@v2``).
VERSION_SEPARATOR: Final = "@"

Versioning: TypeAlias = Literal["pinned", "upgrade"]
VERSIONING_POLICIES: Final = ("pinned", "upgrade")

_VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def check_version_name(version: object) -> str | None:
    """Why ``version`` cannot name a deployment version, or None when it can.

    1-64 letters, digits, ``.``, ``_``, ``+`` or ``-``, starting with a letter or a digit: it
    becomes part of queue names, and ``@`` (the separator) or a dot-suffix like ``.control``
    alone must not be one.
    """
    if not isinstance(version, str) or not _VERSION_NAME.fullmatch(version):
        return (
            f"a deploy version is 1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or a digit, "
            f"not {version!r}"
        )
    if version == AUTO_VERSION:
        return f"{AUTO_VERSION!r} asks for a derived version; it is not a version itself"
    if version.endswith(".control"):
        return f"a deploy version must not end in '.control', as {version!r} does"
    return None


def derive_version(config_hashes: Mapping[str, str]) -> str:
    """The version of a worker whose agents have these config hashes (``auto``).

    The same agents with the same definitions give the same version on every host; any change of
    a prompt, a tool's schema or effect, or the set of agents gives another.
    """
    digest = hashlib.sha256()
    for name in sorted(config_hashes):
        digest.update(f"{name}={config_hashes[name]}\n".encode())
    return f"cfg-{digest.hexdigest()[:12]}"


def versioned_queue(queue: str | None, version: str | None, *, default: str = "threads") -> str | None:
    """The queue a step or call of a run on ``version`` goes to.

    No version: ``queue`` unchanged (None: the app's default queue), as before versions. With
    one: the work queue (``default`` when the agent or tool names none) suffixed with it.
    A queue already suffixed is re-suffixed, so a run moved to another version is routed anew.
    """
    if version is None:
        return queue
    return f"{base_queue(queue or default)}{VERSION_SEPARATOR}{version}"


def base_queue(queue: str) -> str:
    """The work queue without its version suffix (``email@v2`` -> ``email``)."""
    return queue.split(VERSION_SEPARATOR, 1)[0]


def version_of_queue(queue: str | None) -> str | None:
    """The version a queue belongs to (``threads@v2`` -> ``v2``), or None when unversioned."""
    if not queue or VERSION_SEPARATOR not in queue:
        return None
    return queue.split(VERSION_SEPARATOR, 1)[1]


# -- where a new run goes ----------------------------------------------------------------------


def ramp_bucket(run_id: str) -> int:
    """A run's place, 0-99, in the ramp: stable, so a run's redelivery goes where it went."""
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % 100


def choose_version(run_id: str, current: str | None, ramping: str | None, ramp_percent: int) -> str | None:
    """The version a new run starts on: the ramping one for ``ramp_percent`` percent of runs
    (chosen by run id, so the same run always lands the same way), else the current one. None
    when there is no current version: versions are not in use."""
    if ramping is not None and ramping != current and ramp_bucket(run_id) < max(0, min(100, ramp_percent)):
        return ramping
    return current


# -- the versions' states ----------------------------------------------------------------------

VersionState: TypeAlias = Literal["active", "draining", "drained", "retired"]


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """What ``threads-celery deploy status`` shows of one version."""

    version: str
    state: VersionState
    role: str | None
    ramp_percent: int
    #: Workers seen within the liveness window: their ids.
    workers: tuple[str, ...]
    #: Unfinished runs pinned to it, by status.
    runs: Mapping[str, int]
    #: Unfinished runs with no live worker to take them, for longer than the liveness window;
    #: these wait for nothing that will come until a worker of the version starts again or they
    #: are moved (``threads-celery runs upgrade``).
    stranded: int
    #: Why upgrading runs of it stay pinned, and how many: reason -> count.
    pinned_reasons: Mapping[str, int] = field(default_factory=dict)

    @property
    def unfinished(self) -> int:
        return sum(self.runs.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "state": self.state,
            "role": self.role,
            "ramp_percent": self.ramp_percent,
            "workers": list(self.workers),
            "runs": dict(self.runs),
            "unfinished": self.unfinished,
            "stranded": self.stranded,
            "pinned_reasons": dict(self.pinned_reasons),
        }


def version_statuses(
    versions: Sequence[DeployVersion],
    workers: Iterable[tuple[str, str, datetime]],
    unfinished: Iterable[tuple[str, str, int]],
    *,
    now: datetime,
    liveness: timedelta,
    pinned_reasons: Iterable[tuple[str, str, int]] = (),
) -> list[VersionStatus]:
    """Each version's state from the ledger's rows.

    ``workers``: (worker id, version, last seen); ``unfinished``: (version, status, count) of the
    runs not in a terminal status; ``pinned_reasons``: (version, reason, count). A version is
    *active* while it is current or ramping, *draining* while it is neither and runs are still
    pinned to it, *drained* once none are, *retired* once retired (it takes no new work).
    A version's unfinished runs are *stranded* when no worker of it was seen within ``liveness``.
    A version that only appears in runs (a worker never registered it) is listed too.
    """
    live: dict[str, list[str]] = {}
    for worker, version, seen_at in workers:
        if now - seen_at <= liveness:
            live.setdefault(version, []).append(worker)
    counts: dict[str, dict[str, int]] = {}
    for version, status, count in unfinished:
        counts.setdefault(version, {})[status] = counts.get(version, {}).get(status, 0) + count
    reasons: dict[str, dict[str, int]] = {}
    for version, reason, count in pinned_reasons:
        reasons.setdefault(version, {})[reason] = count
    rows = {row.version: row for row in versions}
    for version in (*counts, *live):
        rows.setdefault(version, DeployVersion(version))
    out = []
    for version in sorted(rows, key=lambda v: (rows[v].created_at is None, rows[v].created_at or now, v)):
        row = rows[version]
        by_status = counts.get(version, {})
        state: VersionState
        if row.retired_at is not None:
            state = "retired"
        elif row.role in ("current", "ramping"):
            state = "active"
        else:
            state = "draining" if by_status else "drained"
        workers_of = tuple(sorted(live.get(version, ())))
        out.append(
            VersionStatus(
                version=version,
                state=state,
                role=row.role,
                ramp_percent=row.ramp_percent if row.role == "ramping" else 0,
                workers=workers_of,
                runs=dict(sorted(by_status.items())),
                stranded=0 if workers_of else sum(by_status.values()),
                pinned_reasons=reasons.get(version, {}),
            )
        )
    return out


def retire_refusal(version: str, role: str | None, unfinished: int) -> str | None:
    """Why ``version`` may not be retired now, or None when it may."""
    if role == "current":
        return f"version {version!r} is current: make another version current first"
    if unfinished:
        return (
            f"version {version!r} still has {unfinished} unfinished run(s) pinned to it: let them finish, "
            f"or move them (threads-celery runs upgrade --from {version} --to VERSION)"
        )
    return None


# -- the compatibility check of an upgrade -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call of the run that the new code would pick up: not yet run, waiting for a person or
    a variable, parked, in flight; or a result of the current step the next model turn reads."""

    effect_key: str
    tool: str
    effect: str
    args: str
    status: str
    #: The recorded result (for calls that have one), checked against the new output schema.
    result: str | None = None


#: The call statuses that are still to run or to be decided (or are running).
UNSETTLED_CALL_STATUSES: Final = frozenset(
    {"pending", "awaiting_approval", "awaiting_variable", "started", "parked", "finished"}
)


@dataclass(frozen=True, slots=True)
class UpgradeSubject:
    """What a run has pending, as the ledger records it (the shell reads it)."""

    run_id: str
    agent: str
    status: str
    version: str | None
    #: A worker holds the run's lease now (a step or a guarded call is in flight).
    lease_live: bool
    calls: tuple[PendingCall, ...] = ()
    #: Agent types of the awaited child runs that have not finished.
    awaited_children: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TargetTool:
    """A tool of the target version, as the check needs it: its effect and two validators that
    answer the reason a value fails (None: it fits)."""

    name: str
    effect: str
    check_args: Callable[[str], str | None]
    check_output: Callable[[str], str | None] | None = None


@dataclass(frozen=True, slots=True)
class TargetAgent:
    """An agent of the target version."""

    name: str
    tools: Mapping[str, TargetTool]


@dataclass(frozen=True, slots=True)
class Compatible:
    """Nothing pending would meet code it does not fit: the run may move."""


@dataclass(frozen=True, slots=True)
class Incompatible:
    """The run stays pinned; ``reason`` names the exact incompatibility (the first of ``all``)."""

    reasons: tuple[str, ...]

    @property
    def reason(self) -> str:
        return self.reasons[0]


@dataclass(frozen=True, slots=True)
class NotYet:
    """Not at a step boundary now (a step or a guarded call is in flight): ask again later."""

    reason: str


UpgradeDecision: TypeAlias = Compatible | Incompatible | NotYet

#: Effects whose in-flight call must have an outcome before the run may move.
_GUARDED_IN_FLIGHT: Final = frozenset({"unguarded", "reconcilable", "idempotent"})
_ACTIVE_RUN: Final = frozenset({"queued", "running", "awaiting_approval", "awaiting_variable", "waiting", "parked"})


def check_upgrade(
    subject: UpgradeSubject,
    target_version: str,
    target_agent: TargetAgent | None,
    known_agents: frozenset[str],
) -> UpgradeDecision:
    """Whether ``subject`` may move to ``target_version``, whose definition of the run's agent is
    ``target_agent`` (None: it has none) and whose agents are ``known_agents``.

    Checked, in this order, each failure named exactly: the run's agent exists there; each call
    still to run, waiting, parked or in flight names a tool that exists there, with the same
    effect (a call recorded ``unguarded`` must not become one that reruns), and its recorded
    arguments validate against the new input schema; each result of the current step fits the
    tool's new output schema; each awaited child's agent exists there. A run with a step or a
    guarded call in flight is :class:`NotYet`: it moves only once that has an outcome.
    """
    if subject.status not in _ACTIVE_RUN:
        return Incompatible((f"run {subject.run_id} is {subject.status}: a finished run does not move",))
    if subject.version == target_version:
        return Incompatible((f"run {subject.run_id} is already on {target_version}",))
    in_flight = [c for c in subject.calls if c.status == "started" and c.effect in _GUARDED_IN_FLIGHT]
    if in_flight:
        call = in_flight[0]
        return NotYet(
            f"{call.effect} call {call.effect_key} ({call.tool}) is in flight; it moves once it has an outcome"
        )
    if subject.lease_live:
        return NotYet("a step is in flight; it moves at the next step boundary")
    if target_agent is None:
        return Incompatible((f"agent {subject.agent!r} does not exist in {target_version}",))
    reasons: list[str] = []
    for call in subject.calls:
        tool = target_agent.tools.get(call.tool)
        where = f"call {call.effect_key}"
        if tool is None:
            reasons.append(f"{where}: tool {call.tool!r} does not exist in {target_version}")
            continue
        if tool.effect != call.effect:
            reasons.append(f"{where}: tool {call.tool!r} is {tool.effect} in {target_version}, recorded {call.effect}")
            continue
        if call.status in UNSETTLED_CALL_STATUSES and call.status != "finished":
            failure = tool.check_args(call.args)
            if failure is not None:
                reasons.append(f"{where}: its recorded arguments fail {call.tool!r} in {target_version}: {failure}")
                continue
        if call.result is not None and tool.check_output is not None:
            failure = tool.check_output(call.result)
            if failure is not None:
                reasons.append(
                    f"{where}: its result fails {call.tool!r}'s output schema in {target_version}: {failure}"
                )
    for child in subject.awaited_children:
        if child not in known_agents:
            reasons.append(f"awaited child agent {child!r} does not exist in {target_version}")
    return Incompatible(tuple(reasons)) if reasons else Compatible()
