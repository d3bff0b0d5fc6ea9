"""The named queries of the operations console (a part of :class:`~.repository.Tx`).

Every read here is scoped to one tenant (through ``threads.tenant``) and bounded: lists are
paginated by a keyset on ``(created_at, id)``, and a call's result is read as a preview and as
pages (``substr``), never whole, so that a 50 MB result costs a page's worth of memory.
The indexes they use are ``ix_runs_created_at_id``, ``ix_runs_agent_created_at`` and
``ix_runs_status_created_at`` (migration 0009).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, tuple_
from sqlalchemy.engine import Connection

from threads_celery.records import CallRow, CallTimelineEntry, Message, ModelTurn, PermissionGrant, Run
from threads_celery.store.rows import call_from_mapping, run_from_row
from threads_celery.store.schema import agents, messages, model_usage, permission_grants, runs, threads, tool_calls


def console_runs_query(
    *,
    tenant: str,
    agent: str | None = None,
    statuses: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    thread_id: str | None = None,
    before: tuple[datetime, str] | None = None,
    limit: int = 50,
) -> Select[Any]:
    """The statement of :meth:`ConsoleQueries.console_runs` (its plan is checked against the indexes)."""
    query = (
        select(runs)
        .join(threads, threads.c.id == runs.c.thread_id)
        .where(threads.c.tenant == tenant)
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(limit)
    )
    if agent is not None:
        query = query.where(runs.c.agent == agent)
    if statuses:
        query = query.where(runs.c.status.in_(list(statuses)))
    if since is not None:
        query = query.where(runs.c.created_at >= since)
    if until is not None:
        query = query.where(runs.c.created_at < until)
    if thread_id is not None:
        query = query.where(runs.c.thread_id == thread_id)
    if before is not None:
        at, run_id = before
        # A row comparison, which PostgreSQL answers from the (created_at, id) index directly.
        query = query.where(tuple_(runs.c.created_at, runs.c.id) < tuple_(at, run_id))
    return query


class ConsoleQueries:
    """Reads for the console's pages; mixed into the transaction."""

    conn: Connection

    def console_runs(
        self,
        *,
        tenant: str,
        agent: str | None = None,
        statuses: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        thread_id: str | None = None,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """The tenant's runs, newest first, filtered; ``before`` is the last (created_at, id) of the page before."""
        query = console_runs_query(
            tenant=tenant,
            agent=agent,
            statuses=statuses,
            since=since,
            until=until,
            thread_id=thread_id,
            before=before,
            limit=limit,
        )
        return [run_from_row(row) for row in self.conn.execute(query)]

    def run_status_counts(self, tenant: str) -> dict[str, int]:
        """How many of the tenant's runs are in each status."""
        query = (
            select(runs.c.status, func.count())
            .join(threads, threads.c.id == runs.c.thread_id)
            .where(threads.c.tenant == tenant)
            .group_by(runs.c.status)
        )
        return {str(status): int(count) for status, count in self.conn.execute(query)}

    def tenant_waiting_calls(self, tenant: str, statuses: Sequence[str], *, limit: int = 500) -> list[CallRow]:
        """The tenant's calls in any of ``statuses`` (those that wait for a person), oldest first.

        Scoped in the query, so another tenant's waiting calls never crowd this one's out."""
        query = (
            select(tool_calls)
            .join(threads, threads.c.id == tool_calls.c.thread_id)
            .where(threads.c.tenant == tenant, tool_calls.c.status.in_(list(statuses)))
            .order_by(tool_calls.c.created_at)
            .limit(limit)
        )
        return [call_from_mapping(row._mapping) for row in self.conn.execute(query)]

    def call_timeline(self, run_id: str, *, preview_chars: int) -> list[CallTimelineEntry]:
        """The run's tool calls in order, each with at most ``preview_chars`` of its arguments and of
        its whole result (and the length of each)."""
        whole = func.coalesce(tool_calls.c.full_result, tool_calls.c.result)
        query = (
            select(
                tool_calls.c.effect_key,
                tool_calls.c.run_id,
                tool_calls.c.step,
                tool_calls.c.idx,
                tool_calls.c.tool,
                func.substr(tool_calls.c.args, 1, preview_chars).label("args_preview"),
                func.length(tool_calls.c.args).label("args_chars"),
                tool_calls.c.effect,
                tool_calls.c.status,
                tool_calls.c.attempt,
                tool_calls.c.created_at,
                tool_calls.c.first_started_at,
                tool_calls.c.finished_at,
                tool_calls.c.is_error,
                tool_calls.c.park_reason,
                tool_calls.c.resolution,
                tool_calls.c.resolved_by,
                tool_calls.c.approved_by,
                func.substr(whole, 1, preview_chars).label("preview"),
                func.length(whole).label("chars"),
            )
            .where(tool_calls.c.run_id == run_id)
            .order_by(tool_calls.c.step, tool_calls.c.idx)
        )
        return [
            CallTimelineEntry(
                effect_key=m["effect_key"],
                run_id=m["run_id"],
                step=m["step"],
                index=m["idx"],
                tool=m["tool"],
                args=m["args_preview"],
                args_chars=int(m["args_chars"] or 0),
                effect=m["effect"],
                status=m["status"],
                attempt=m["attempt"],
                created_at=m["created_at"],
                first_started_at=m["first_started_at"],
                finished_at=m["finished_at"],
                is_error=bool(m["is_error"]),
                park_reason=m["park_reason"],
                resolution=m["resolution"],
                resolved_by=m["resolved_by"],
                approved_by=m["approved_by"],
                result_preview=m["preview"],
                result_chars=int(m["chars"] or 0),
            )
            for m in (row._mapping for row in self.conn.execute(query))
        ]

    def model_turns(self, run_id: str) -> list[ModelTurn]:
        """The run's committed model calls in step order, with their usage."""
        query = select(model_usage).where(model_usage.c.run_id == run_id).order_by(model_usage.c.step)
        return [
            ModelTurn(
                run_id=m["run_id"],
                step=m["step"],
                model=m["model"],
                requests=m["requests"],
                input_tokens=m["input_tokens"],
                output_tokens=m["output_tokens"],
                cost=m["cost"],
                created_at=m["created_at"],
            )
            for m in (row._mapping for row in self.conn.execute(query))
        ]

    def run_replies(self, thread_id: str, run_id: str) -> list[Message]:
        """The run's own model replies (assistant messages) in order: their text, not their tool results."""
        query = (
            select(messages.c.seq, messages.c.text, messages.c.created_at)
            .where(messages.c.thread_id == thread_id, messages.c.run_id == run_id, messages.c.role == "assistant")
            .order_by(messages.c.seq)
        )
        return [
            Message(
                thread_id=thread_id,
                seq=row.seq,
                role="assistant",
                text=row.text,
                run_id=run_id,
                created_at=row.created_at,
            )
            for row in self.conn.execute(query)
        ]

    def result_page(self, effect_key: str, *, offset: int, size: int) -> tuple[str, int] | None:
        """``size`` characters of a call's whole result from ``offset`` (0-based), and its whole
        length; ("", 0) while it has none; None for no such call."""
        whole = func.coalesce(tool_calls.c.full_result, tool_calls.c.result)
        row = self.conn.execute(
            select(func.substr(whole, offset + 1, size), func.length(whole)).where(
                tool_calls.c.effect_key == effect_key
            )
        ).first()
        if row is None:
            return None
        return (row[0] or "", int(row[1] or 0))

    def tenant_grants(self, tenant: str, *, limit: int = 500) -> list[PermissionGrant]:
        """The remembered decisions on the tenant's threads, newest first."""
        query = (
            select(permission_grants)
            .join(threads, threads.c.id == permission_grants.c.thread_id)
            .where(threads.c.tenant == tenant)
            .order_by(permission_grants.c.granted_at.desc())
            .limit(limit)
        )
        return [
            PermissionGrant(
                thread_id=m["thread_id"], tool=m["tool"], granted_by=m["granted_by"], granted_at=m["granted_at"]
            )
            for m in (row._mapping for row in self.conn.execute(query))
        ]

    def agent_descriptions(self) -> list[dict[str, Any]]:
        """What the store recorded of each registered agent (its tools, effects, variables), by name."""
        query = select(agents.c.name, agents.c.description, agents.c.updated_at).order_by(agents.c.name)
        return [
            {**(row.description or {}), "name": row.name, "updated_at": row.updated_at}
            for row in self.conn.execute(query)
        ]
