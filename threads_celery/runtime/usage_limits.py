"""The reads behind the usage-limit check made before each model call.

The decision is :func:`threads_celery.decisions.usage.limit_reached`, a pure function of the
totals and the limits; this is its shell, which loads from the ledger the totals each of the
agent's limits names. It lives above the store because what a scope counts (from a person's
allowance on; the agent's scope over the current UTC day) is the usage policy's business, not
the ledger's.
"""

from __future__ import annotations

from datetime import datetime

from threads_celery.decisions.usage import ALLOWED_EVENT, Scope, UsageLimits, day_bounds
from threads_celery.records import UsageTotals
from threads_celery.store import Tx


def totals_for_limits(
    tx: Tx, run_id: str, thread_id: str, agent: str, limits: UsageLimits, now: datetime
) -> dict[Scope, UsageTotals]:
    """The totals each scope of ``limits`` names: this run, this thread, the agent today (UTC)."""
    since, until = day_bounds(now)
    # A person let the run go past a limit: its usage counts again from that moment.
    allowed = tx.last_event_of(thread_id, run_id, ALLOWED_EVENT)
    allowed_at = datetime.fromisoformat(str(allowed["at"])) if allowed and allowed.get("at") else None
    totals: dict[Scope, UsageTotals] = {}
    for scope, _ in limits.scopes():
        if scope == "run":
            totals[scope] = tx.usage_totals(run_id=run_id, since=allowed_at)
        elif scope == "thread":
            totals[scope] = tx.usage_totals(thread_id=thread_id, since=allowed_at)
        else:
            start = max(since, allowed_at) if allowed_at is not None else since
            totals[scope] = tx.usage_totals(agent=agent, since=start, until=until)
    return totals
