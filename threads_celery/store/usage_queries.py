"""The named queries of model usage (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection

from threads_celery.records import UsageTotals
from threads_celery.store.schema import model_usage, threads, tool_calls

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

    def add_step_usage(
        self,
        *,
        run_id: str,
        step: int,
        thread_id: str,
        agent: str,
        model: str,
        requests: int,
        input_tokens: int,
        output_tokens: int,
        cost: float | None,
        now: datetime,
    ) -> None:
        """Add to model ``step``'s usage what a call of that step spent on models of its own (a
        delegate agent it ran): counted with the step whose reply asked for the call."""
        values = {
            "requests": model_usage.c.requests + requests,
            "input_tokens": model_usage.c.input_tokens + input_tokens,
            "output_tokens": model_usage.c.output_tokens + output_tokens,
        }
        if cost is not None:
            values["cost"] = func.coalesce(model_usage.c.cost, 0.0) + cost
        added = self.conn.execute(
            update(model_usage).where(model_usage.c.run_id == run_id, model_usage.c.step == step).values(values)
        ).rowcount
        if not added:  # the step recorded none (a model that reports nothing): the call's is its row
            self.record_usage(
                run_id=run_id, step=step, thread_id=thread_id, agent=agent, model=model, requests=requests,
                input_tokens=input_tokens, output_tokens=output_tokens, cost=cost, now=now,
            )  # fmt: skip

    def usage_before(self, run_id: str, step: int) -> tuple[UsageTotals, int]:
        """What ``run_id`` has used up to model ``step`` included (its requests and tokens), and how
        many of its tool calls of earlier steps succeeded: what Pydantic AI's ``ctx.usage`` holds
        in a tool of that step."""
        succeeded = (
            select(func.count())
            .select_from(tool_calls)
            .where(
                tool_calls.c.run_id == run_id,
                tool_calls.c.step < step,
                tool_calls.c.status == "completed",
                tool_calls.c.is_error.is_(False),
            )
            .scalar_subquery()
        )
        requests, input_tokens, output_tokens, cost, calls = self.conn.execute(
            select(
                func.coalesce(func.sum(model_usage.c.requests), 0),
                func.coalesce(func.sum(model_usage.c.input_tokens), 0),
                func.coalesce(func.sum(model_usage.c.output_tokens), 0),
                func.sum(model_usage.c.cost),
                succeeded,
            ).where(model_usage.c.run_id == run_id, model_usage.c.step <= step)
        ).one()
        totals = UsageTotals(
            int(requests), int(input_tokens), int(output_tokens), None if cost is None else float(cost)
        )
        return totals, int(calls or 0)

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
