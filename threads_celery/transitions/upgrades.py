"""The upgrade of a run to another deployment version, as a transition like approve or cancel:
each function is one piece of a transaction (it takes a :class:`~threads_celery.store.Tx`) and
returns what the caller publishes after commit.

Whether a run may move is decided before, by the pure
:func:`threads_celery.decisions.deploys.check_upgrade`, on a worker of the target version (whose
agents are the new code): see :mod:`threads_celery.runtime.deploys`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from threads_celery.decisions.deploys import versioned_queue
from threads_celery.records import OutboxEntry, Run
from threads_celery.store import Tx
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK

UPGRADE_TASK = "threads.upgrade"


def upgrade_entry(run_id: str, version: str) -> OutboxEntry:
    """The task that checks and moves one run, on a worker of ``version`` (its queue), whose
    agents are the code the run would move to."""
    return OutboxEntry(
        key=f"upgrade:{run_id}:{version}",
        task=UPGRADE_TASK,
        args=(run_id, version),
        queue=versioned_queue(None, version),
        argsrepr=f"(run {run_id} to {version})",
    )


def move_run(tx: Tx, run: Run, target: str, now: datetime) -> list[OutboxEntry] | None:
    """Move ``run`` to ``target``: fenced on the run as it was checked, and only with no lease
    live (no step or guarded call in flight). The work waiting for it in the outbox is routed to
    ``target``'s queues (returned, to publish); a message already sent to the old version's queue
    is handed on by the worker that takes it. None if the run moved on since it was checked."""
    fence = tx.move_run_version(run.id, fence=run.fence, version=target, now=now)
    if fence is None:
        return None
    entries: list[OutboxEntry] = []
    for entry in tx.outbox_of_runs([run.id]):
        if entry.task not in (STEP_TASK, TOOL_TASK):
            continue
        queue = versioned_queue(entry.queue, target)
        tx.reroute_outbox(entry.key, queue)
        entries.append(replace(entry, queue=queue))
    tx.append_event(
        run.thread_id, run.id, "deploy", {"run_id": run.id, "version": target, "from": run.deploy_version}, now
    )
    return entries


def pin_run(tx: Tx, run: Run, target: str, reasons: tuple[str, ...], now: datetime) -> None:
    """Keep ``run`` where it is, recording why it cannot move to ``target`` (every reason), so
    that the backbone does not check it against ``target`` again and the status shows it."""
    tx.pin_run_version(run.id, checked=target, reason="; ".join(reasons))
    tx.append_event(
        run.thread_id, run.id, "deploy",
        {"run_id": run.id, "version": run.deploy_version, "pinned": reasons[0], "checked": target},
        now,
    )  # fmt: skip
