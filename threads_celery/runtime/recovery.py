"""The backbone's tick (``threads.reconcile``): recover what a dead worker or a lost message left.

Beat sends the tick every few seconds (see :mod:`threads_celery.decisions.backbone` for its
queue and pacing). Each pass re-dispatches runs whose lease expired (their driver died), publishes
again the outbox rows nobody consumed in time, and runs the agent-tool pass (budgets and
redelivery, :func:`threads_celery.runtime.delivery.reconcile_agent_tools`). What a re-dispatched
task then does is decided by the task itself from the ledger (the call's effect, see
:mod:`threads_celery.decisions.effects`), so the tick never guesses.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from threads_celery.decisions.backbone import republish_delay
from threads_celery.records import OutboxEntry
from threads_celery.runtime.delivery import reconcile_agent_tools
from threads_celery.runtime.outcomes import step_queue
from threads_celery.runtime.ports import Worker
from threads_celery.transitions import runs

log = logging.getLogger("threads_celery.runtime.recovery")


def reconcile_tick(worker: Worker, *, limit: int = 500) -> dict[str, int]:
    """One pass of the backbone: re-dispatch runs whose driver died, republish lost rows.

    A run whose lease expired is fenced off (its holder's late writes will be refused) and
    its current task goes back into the outbox; that task then decides by the call's effect.
    Safe from several processes at once: rows are taken with SKIP LOCKED, and the cost is
    proportional to what is due (both queries walk an index on the due time).
    """
    now = worker.clock()
    redispatched: list[OutboxEntry] = []
    with worker.store.transaction() as tx:
        for run in tx.expired_runs(now=now, limit=limit):
            call = tx.started_call(run.id, run.step - 1) if run.step > 0 else None
            entry = (
                runs.tool_entry(call.effect_key, call.tool, call.queue)
                if call is not None
                else runs.step_entry(run, run.step, run.agent, step_queue(worker.registry, run.agent))
            )
            if call is None:
                # A model step's attempt that may have reached the provider: its usage counts it.
                tx.advance_run(
                    run.id, fence=run.fence, now=now, lease_owner=None, lease_expires_at=None,
                    voided_step=run.step, voided_requests=run.voided_after_claim(run.step),
                )  # fmt: skip
            else:
                tx.advance_run(run.id, fence=run.fence, now=now, lease_owner=None, lease_expires_at=None)
            tx.insert_outbox(entry, now)
            redispatched.append(entry)
            log.warning("run %s: lease of %s expired; re-dispatching %s", run.id, run.lease_owner, entry.key)
    worker.publish([replace(e, recovered=True) for e in redispatched])
    with worker.store.transaction() as tx:
        due = tx.due_outbox(now=now, limit=limit, republish_delay=republish_delay)
    # Not urgent: behind a backlog most due rows are only waiting in the queue, and an urgent
    # copy of each would flood the lane that a dead worker's runs recover through.
    worker.publish(due)
    counts = {"expired_runs": len(redispatched), "republished": len(due)}
    counts.update({k: v for k, v in reconcile_agent_tools(worker, limit=limit).items() if v})
    return counts
