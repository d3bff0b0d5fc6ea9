"""The named queries of model usage (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from threads_celery.records import UsageTotals
from threads_celery.store.schema import model_usage, threads

#: Built once: a statement built per call costs its construction and cache key every step.
_INSERT_USAGE = insert(model_usage)


class UsageQueries:
    """Queries over ``model_usage``; mixed into the transaction."""

    conn: Connection

    def record_usage(
        self,
        *,
        run_id: str,
        step: int,
        thread_id: str,
        agent: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cost: float | None,
        now: datetime,
        requests: int = 1,
    ) -> None:
        """Record a committed model step's usage (the step's transaction holds it: once per step):
        ``requests`` counts the attempts the provider may have billed, voided ones included."""
        self.conn.execute(
            _INSERT_USAGE,
            {
                "run_id": run_id,
                "step": step,
                "thread_id": thread_id,
                "agent": agent,
                "model": model[:255],
                "requests": requests,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cost": cost,
                "created_at": now,
            },
        )

    def has_usage(self, run_id: str, step: int) -> bool:
        """Whether ``run_id``'s model ``step`` has its usage recorded (an attempt of it committed)."""
        found = self.conn.execute(
            select(model_usage.c.step).where(model_usage.c.run_id == run_id, model_usage.c.step == step)
        ).first()
        return found is not None

    def usage_totals(
        self,
        *,
        run_id: str | None = None,
        thread_id: str | None = None,
        agent: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: str | None = None,
    ) -> UsageTotals:
        """Sums over the rows that match every filter given (``tenant``: of that tenant's threads)."""
        query = select(
            func.coalesce(func.sum(model_usage.c.requests), 0),
            func.coalesce(func.sum(model_usage.c.input_tokens), 0),
            func.coalesce(func.sum(model_usage.c.output_tokens), 0),
            func.sum(model_usage.c.cost),
        )
        if run_id is not None:
            query = query.where(model_usage.c.run_id == run_id)
        if thread_id is not None:
            query = query.where(model_usage.c.thread_id == thread_id)
        if agent is not None:
            query = query.where(model_usage.c.agent == agent)
        if since is not None:
            query = query.where(model_usage.c.created_at >= since)
        if until is not None:
            query = query.where(model_usage.c.created_at < until)
        if tenant is not None:
            query = query.where(model_usage.c.thread_id.in_(select(threads.c.id).where(threads.c.tenant == tenant)))
        requests, input_tokens, output_tokens, cost = self.conn.execute(query).one()
        return UsageTotals(
            int(requests),
            int(input_tokens),
            int(output_tokens),
            None if cost is None else float(cost),
        )
