"""Deploy versions in the worker: placing runs, keeping each on its version, moving upgrading runs.

A worker of version V (``THREADS_DEPLOY_VERSION``) takes a step or a call only of a run on V:

- A run on no version yet (its first step, or a run from before versions were in use) is placed
  when its first step is taken: on the current version, or the ramping one for its share of new
  runs (:func:`~threads_celery.decisions.deploys.choose_version`); a run from before versions is
  adopted by the version that takes it.
- A run on another version is handed back: the step's claim is released and its outbox row
  written again on the right version's queue (``threads@v1``), or the call's task is sent there.
  Routing does the rest; this is what keeps a misrouted message (the client's, which knows no
  version, or a tick's republish from a worker of another version) from running on the wrong code.
- Each step and call a worker takes is marked with its version (``deploy_marks``).

An upgrade (``threads.upgrade``, sent by the backbone for runs of ``versioning="upgrade"``
agents, or ``threads-celery runs upgrade``) runs on a worker of the target version, whose agents
are the new code: the pure :func:`~threads_celery.decisions.deploys.check_upgrade` decides, and
:func:`threads_celery.transitions.upgrades.move_run` applies.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from threads_celery.decisions.deploys import (
    Compatible,
    Incompatible,
    NotYet,
    PendingCall,
    TargetAgent,
    TargetTool,
    UpgradeDecision,
    UpgradeSubject,
    check_upgrade,
    choose_version,
    version_statuses,
    versioned_queue,
)
from threads_celery.definitions.tools import ToolArgumentsError, ToolOutputError
from threads_celery.records import CallRow, OutboxEntry, Run
from threads_celery.transitions import runs as run_transitions
from threads_celery.transitions import upgrades
from threads_celery.transitions.upgrades import upgrade_entry

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent, AgentRegistry
    from threads_celery.definitions.tools import Tool
    from threads_celery.runtime.ports import Worker
    from threads_celery.store import Store

log = logging.getLogger("threads_celery.runtime.deploys")

#: Upgrades the backbone sends per tick at most.
UPGRADES_PER_TICK = 100
#: Workers not seen for this long are dropped from the ledger (they are long gone).
FORGET_WORKERS_AFTER = timedelta(days=1)
#: How often a version's stranded runs are logged again while they stay stranded.
STRANDED_LOG_EVERY_S = 60.0


def _step_queue(worker: Worker, agent: str, version: str) -> str | None:
    queue = worker.registry.get(agent).queue if agent in worker.registry else None
    return versioned_queue(queue, version)


def _policy(worker: Worker, agent: str) -> str:
    return worker.registry.get(agent).versioning if agent in worker.registry else "pinned"


# -- the guard of a step and of a call ---------------------------------------------------------


def route_step(worker: Worker, mine: str, run: Run, fence: int, step: int) -> str | None:
    """After the claim of ``step`` by a worker of version ``mine``: None to go on (the run is on
    ``mine``, placed there now if it was on none), or what was done instead (handed back to the
    run's version, the claim released)."""
    now = worker.clock()
    target = run.deploy_version
    with worker.store.transaction() as tx:
        if target is None:
            if step == 0:
                current, ramping, percent = tx.placement()
                target = choose_version(run.id, current, ramping, percent) or mine
            else:  # a run from before versions were in use: the version that takes it adopts it
                target = mine
            tx.place_run(run.id, target, _policy(worker, run.agent))
        if target == mine:
            tx.mark_version(run_transitions.step_key(run.id, step), run.id, mine, now)
            return None
        # Not ours: give the claim back (no attempt reached the provider) and send the step on.
        tx.advance_run(run.id, fence=fence, now=now, lease_owner=None, lease_expires_at=None)
        entry = replace(run_transitions.step_entry(run, step, run.agent), queue=_step_queue(worker, run.agent, target))
        tx.insert_outbox(entry, now)
    worker.publish([entry])
    return f"routed: run is on version {target}"


def route_call(worker: Worker, mine: str, run: Run, call: CallRow) -> str | None:
    """Before a call of ``run`` is taken by a worker of version ``mine``: None to go on, or
    what was done instead (the call's task sent to the run's version). Its outbox row stays
    until a worker of that version takes it, so nothing is lost if this send is."""
    if run.deploy_version is None or run.is_terminal:
        return None
    if run.deploy_version == mine:
        with worker.store.transaction() as tx:
            tx.mark_version(call.effect_key, run.id, mine, worker.clock())
        return None
    entry = run_transitions.tool_entry(call.effect_key, call.tool, versioned_queue(call.queue, run.deploy_version))
    worker.publish([entry])
    return f"routed: run is on version {run.deploy_version}"


# -- the upgrade -------------------------------------------------------------------------------


def _arguments_check(tool: Tool) -> Any:
    def check(raw: str) -> str | None:
        try:
            tool.parse_arguments(raw)
        except ToolArgumentsError as exc:
            return str(exc)
        return None

    return check


def _output_check(tool: Tool) -> Any:
    def check(raw: str) -> str | None:
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        try:
            tool.check_output(value)
        except ToolOutputError as exc:
            return str(exc).split(": ", 1)[-1]
        return None

    return check


def target_agent(agent: Agent) -> TargetAgent:
    """The check's view of an agent of the target version (its runtime tools, as the model sees them)."""
    return TargetAgent(
        name=agent.name,
        tools={
            t.name: TargetTool(
                name=t.name,
                effect=t.effect,
                check_args=_arguments_check(t),
                check_output=_output_check(t) if t.output is not None else None,
            )
            for t in agent.runtime_tools
        },
    )


def upgrade_subject(store: Store, run: Run, now: datetime) -> UpgradeSubject:
    """What ``run`` has pending, read from the ledger."""
    with store.read() as tx:
        rows = tx.calls_to_check(run.id, run.step - 1)
        children = tx.awaited_child_agents(run.id)
    calls = tuple(
        PendingCall(
            effect_key=r["effect_key"],
            tool=r["tool"],
            effect=r["effect"],
            args=r["args"],
            status=r["status"],
            result=None if r["is_error"] or r["result"] is None else r["result"],
        )
        for r in rows
    )
    lease_live = run.lease_expires_at is not None and run.lease_expires_at > now
    return UpgradeSubject(
        run_id=run.id, agent=run.agent, status=run.status, version=run.deploy_version, lease_live=lease_live,
        calls=calls, awaited_children=tuple(children),
    )  # fmt: skip


Outcome = Literal["moved", "pinned", "not_yet", "compatible", "missing"]


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    """What an upgrade did (or, on a dry run, would do) to one run."""

    run_id: str
    from_version: str | None
    to_version: str
    outcome: Outcome
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "from": self.from_version,
            "to": self.to_version,
            "outcome": self.outcome,
            "reason": self.reason,
        }


def decide_upgrade(store: Store, registry: AgentRegistry, run: Run, target: str, now: datetime) -> UpgradeDecision:
    """The compatibility check of ``run`` against ``registry``, the agents of version ``target``."""
    agent = registry.get(run.agent) if run.agent in registry else None
    known = frozenset(a.name for a in registry)
    return check_upgrade(upgrade_subject(store, run, now), target, target_agent(agent) if agent else None, known)


def upgrade_run(
    worker: Worker, run_id: str, target: str, *, dry_run: bool = False, record_pin: bool = True
) -> UpgradeReport:
    """Check ``run_id`` against this worker's agents (those of ``target``) and, unless
    ``dry_run``, move it there or record why it stays (``record_pin``)."""
    now = worker.clock()
    run = worker.store.run(run_id)
    if run is None:
        return UpgradeReport(run_id, None, target, "missing", "no such run")
    decision = decide_upgrade(worker.store, worker.registry, run, target, now)
    if isinstance(decision, NotYet):
        return UpgradeReport(run_id, run.deploy_version, target, "not_yet", decision.reason)
    if isinstance(decision, Incompatible):
        if not dry_run and record_pin and run.deploy_version != target and not run.is_terminal:
            with worker.store.transaction() as tx:
                upgrades.pin_run(tx, run, target, decision.reasons, now)
        return UpgradeReport(run_id, run.deploy_version, target, "pinned", "; ".join(decision.reasons))
    assert isinstance(decision, Compatible)
    if dry_run:
        return UpgradeReport(run_id, run.deploy_version, target, "compatible")
    moved = move_run(worker, run, target, now)
    if moved is None:
        return UpgradeReport(run_id, run.deploy_version, target, "not_yet", "the run moved on meanwhile; ask again")
    return UpgradeReport(run_id, run.deploy_version, target, "moved")


def move_run(worker: Worker, run: Run, target: str, now: datetime) -> list[OutboxEntry] | None:
    """The upgrade transition (:func:`threads_celery.transitions.upgrades.move_run`), committed
    and its rerouted work published. None if the run moved on meanwhile."""
    with worker.store.transaction() as tx:
        entries = upgrades.move_run(tx, run, target, now)
    if entries is None:
        return None
    worker.publish(entries)
    log.info("run %s: moved from version %s to %s", run.id, run.deploy_version, target)
    return entries


# -- the backbone's part -----------------------------------------------------------------------

_stranded_logged: dict[str, tuple[int, float]] = {}


def deploy_sweep(worker: Worker) -> dict[str, int]:
    """The backbone's pass over versions: send the due upgrades to the current version's
    workers, flag versions whose unfinished runs have no live worker, forget long-gone workers."""
    now = worker.clock()
    liveness = timedelta(seconds=worker.settings.deploy_liveness_s)
    with worker.store.transaction() as tx:
        versions = tx.deploy_versions()
        if not versions:
            return {}
        current, _, _ = tx.placement()
        due = tx.due_upgrades(current, limit=UPGRADES_PER_TICK) if current is not None else []
        tx.forget_workers_before(now - FORGET_WORKERS_AFTER)
        statuses = version_statuses(
            versions, tx.deploy_workers_seen(), tx.unfinished_by_version(), now=now, liveness=liveness
        )
    assert current is not None or not due
    if due:
        worker.publish([upgrade_entry(run_id, current) for run_id, _ in due if current is not None])
    stranded = 0
    for status in statuses:
        stranded += status.stranded
        if status.stranded:
            logged = _stranded_logged.get(status.version)
            if logged is None or logged[0] != status.stranded or time.monotonic() - logged[1] > STRANDED_LOG_EVERY_S:
                _stranded_logged[status.version] = (status.stranded, time.monotonic())
                log.warning(
                    "version %s has %d unfinished run(s) and no live worker: start a worker of it, or move them "
                    "(threads-celery runs upgrade --from %s --to VERSION)",
                    status.version, status.stranded, status.version,
                )  # fmt: skip
        else:
            _stranded_logged.pop(status.version, None)
    return {"upgrades_sent": len(due), "stranded_runs": stranded}
