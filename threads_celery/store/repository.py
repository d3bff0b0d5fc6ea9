"""The ledger's entry points: :class:`Store` opens transactions, :class:`Tx` names their queries.

Nothing outside the store package builds SQL. :class:`Tx` holds the queries of agents, threads,
runs, variables and the outbox, and the result commit of a tool call, which spans several of
them; the queries of one subject each live in a ``*_queries`` module mixed into it. Rows become
the frozen values of :mod:`threads_celery.records` (:mod:`.rows`) and never leave as rows.
Writes that belong to a run's driver are conditional on the run's fence. The operations a
worker's hot path runs on their own (one statement each on PostgreSQL) are :class:`Store`'s,
from :mod:`.operations`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, insert, select, update
from sqlalchemy.engine import Connection, Engine

from threads_celery.records import (
    DEFAULT_TENANT,
    UNSETTLED_STATUSES,
    CallRow,
    OutboxEntry,
    Run,
    Thread,
    ToolResult,
    storable_text,
)
from threads_celery.store import statements
from threads_celery.store.agent_tool_queries import AgentToolQueries
from threads_celery.store.availability import unreachable_as_store_unavailable
from threads_celery.store.branch_queries import BranchQueries
from threads_celery.store.call_queries import CallQueries
from threads_celery.store.console_queries import ConsoleQueries
from threads_celery.store.deploy_queries import DeployQueries
from threads_celery.store.direct import DirectStatements
from threads_celery.store.grant_queries import GrantQueries
from threads_celery.store.history_queries import HistoryQueries
from threads_celery.store.message_queries import MessageQueries
from threads_celery.store.metrics_queries import MetricsQueries
from threads_celery.store.operations import OwnOperations, claim_params, commit_result_params
from threads_celery.store.outbox_queries import OutboxQueries
from threads_celery.store.rows import run_from_row, thread_from_row
from threads_celery.store.schema import agents, runs, threads, tool_calls, variables
from threads_celery.store.usage_queries import UsageQueries

log = logging.getLogger("threads_celery.store")


class Store(OwnOperations):
    """The ledger: a narrow interface over one database."""

    def __init__(
        self,
        engine: Engine,
        *,
        step_grace_s: float = 10.0,
        tool_grace_s: float = 300.0,
        direct: bool = True,
        flush_every_commit: bool = False,
    ) -> None:
        """``direct=False`` runs the hot path's operations through SQLAlchemy too (on PostgreSQL,
        each then takes a transaction of several statements): slower, and what engine event
        listeners see whole. ``flush_every_commit`` makes every commit wait for the disk, those
        whose loss to a crash of PostgreSQL costs only a repetition too (THREADS_FLUSH_EVERY_COMMIT)."""
        self.engine = engine
        self.flush_every_commit = flush_every_commit
        self.dialect = engine.dialect.name
        self.step_grace = timedelta(seconds=step_grace_s)
        self.tool_grace = timedelta(seconds=tool_grace_s)
        # A tool call's own one-statement operations skip SQLAlchemy's Connection on PostgreSQL.
        self._direct = DirectStatements(engine) if direct and self.dialect == "postgresql" else None
        #: Called after a transaction that appended events commits, with the threads they are
        #: in (the client tells the threads' live subscribers with it); never raises into the
        #: caller.
        self.on_events_committed: Callable[[frozenset[str]], None] | None = None

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One read-write transaction, committed on success and rolled back on error."""
        with unreachable_as_store_unavailable(self.engine.url), self.engine.begin() as conn:
            tx = Tx(conn, self)
            yield tx
        if tx.event_threads and self.on_events_committed is not None:
            try:
                self.on_events_committed(frozenset(tx.event_threads))
            except Exception as exc:  # noqa: BLE001 - the commit stands; a listener is told best effort
                log.warning("after a commit: %s: %s", type(exc).__name__, exc)

    @contextmanager
    def read(self) -> Iterator[Tx]:
        """Reads outside a write transaction.

        On PostgreSQL each statement runs in autocommit: under READ COMMITTED every statement
        of a transaction takes its own snapshot anyway, so this reads the same rows and saves
        the BEGIN and ROLLBACK round trips. On SQLite, a deferred transaction, so readers do
        not queue on writers.
        """
        with unreachable_as_store_unavailable(self.engine.url), self.engine.connect() as conn:
            if self.dialect == "postgresql":
                conn.execution_options(isolation_level="AUTOCOMMIT")
            else:
                conn.execution_options(threads_readonly=True)
            yield Tx(conn, self)

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        with self.read() as tx:
            tx.conn.execute(select(1))

    def dispose(self) -> None:
        if self._direct is not None:
            self._direct.dispose()
        self.engine.dispose()


def args_digest(args: str) -> str:
    """The hash an approval binds to: the exact argument text, as the ledger holds it."""
    return hashlib.sha256(storable_text(args).encode()).hexdigest()


class Tx(
    BranchQueries,
    CallQueries,
    OutboxQueries,
    MessageQueries,
    AgentToolQueries,
    UsageQueries,
    GrantQueries,
    MetricsQueries,
    ConsoleQueries,
    DeployQueries,
    HistoryQueries,
):
    """The named queries of one transaction."""

    def __init__(self, conn: Connection, store: Store) -> None:
        self.conn = conn
        #: The threads this transaction appended events to (see Store.on_events_committed).
        self.event_threads: set[str] = set()
        self.dialect = store.dialect
        self.step_grace = store.step_grace
        self.tool_grace = store.tool_grace

    # -- agents ------------------------------------------------------------------------------

    def upsert_agent(self, name: str, config_hash: str, description: dict[str, Any], now: datetime) -> None:
        row = self.conn.execute(select(agents.c.config_hash, agents.c.description).where(agents.c.name == name)).first()
        if row is None:  # another process may insert it meanwhile: then this definition is written over it
            self.conn.execute(
                statements.insert_agent(self.dialect),
                {"b_name": name, "b_config_hash": config_hash, "b_description": description, "b_updated_at": now},
            )
        elif row.config_hash != config_hash or row.description != description:
            # The description also holds what the hash leaves out on purpose (the agent's queue).
            self.conn.execute(
                update(agents)
                .where(agents.c.name == name)
                .values(config_hash=config_hash, description=description, updated_at=now)
            )

    def agent_hash(self, name: str) -> str | None:
        return self.conn.execute(select(agents.c.config_hash).where(agents.c.name == name)).scalar()

    # -- threads -----------------------------------------------------------------------------

    def get_thread(self, thread_id: str, *, lock: bool = False) -> Thread | None:
        query = select(threads).where(threads.c.id == thread_id)
        if lock:
            query = query.with_for_update()
        row = self.conn.execute(query).first()
        return thread_from_row(row) if row is not None else None

    def insert_thread(
        self,
        thread_id: str,
        agent: str,
        config_hash: str,
        now: datetime,
        parent_thread_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> None:
        """A new thread; without ``tenant`` it belongs to its parent's tenant (or the default one)."""
        if tenant is None and parent_thread_id is not None:
            tenant = self.thread_tenant(parent_thread_id)
        self.conn.execute(
            insert(threads).values(
                id=thread_id,
                agent=agent,
                config_hash=config_hash,
                parent_thread_id=parent_thread_id,
                active_run_id=None,
                event_seq=0,
                created_at=now,
                tenant=tenant or DEFAULT_TENANT,
            )
        )

    def thread_tenant(self, thread_id: str) -> str | None:
        """The tenant that owns the thread, or None when there is no such thread."""
        return self.conn.execute(select(threads.c.tenant).where(threads.c.id == thread_id)).scalar()

    def thread_tenants(self, thread_ids: Sequence[str]) -> dict[str, str]:
        """The owning tenant of each of these threads that exists."""
        if not thread_ids:
            return {}
        rows = self.conn.execute(select(threads.c.id, threads.c.tenant).where(threads.c.id.in_(list(set(thread_ids)))))
        return {row.id: row.tenant for row in rows}

    def set_active_run(self, thread_id: str, run_id: str | None, *, expected: str | None) -> bool:
        """Hand the thread to ``run_id`` if it is held by ``expected`` (None: idle)."""
        held = threads.c.active_run_id.is_(None) if expected is None else threads.c.active_run_id == expected
        result = self.conn.execute(update(threads).where(threads.c.id == thread_id, held).values(active_run_id=run_id))
        return result.rowcount == 1

    # -- runs --------------------------------------------------------------------------------

    def insert_run(
        self,
        run_id: str,
        thread_id: str,
        agent: str,
        input: str,
        now: datetime,
        *,
        agent_tool_run_id: str | None = None,
        input_meta: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> None:
        self.append_event(thread_id, run_id, "run", {"run_id": run_id, "status": "queued", "agent": agent}, now)
        self.conn.execute(
            insert(runs).values(
                id=run_id,
                thread_id=thread_id,
                agent=agent,
                status="queued",
                input=input,
                input_meta=input_meta,
                agent_tool_run_id=agent_tool_run_id,
                traceparent=traceparent,
                step=0,
                fence=0,
                created_at=now,
                updated_at=now,
            )
        )

    def get_run(self, run_id: str, *, lock: bool = False) -> Run | None:
        query = statements.GET_RUN_LOCKED if lock else statements.GET_RUN
        row = self.conn.execute(query, {"b_id": run_id}).first()
        return run_from_row(row) if row is not None else None

    def next_queued_run(self, thread_id: str, *, after: str) -> Run | None:
        """The oldest run still queued on the thread behind ``after``."""
        row = self.conn.execute(
            select(runs)
            .where(runs.c.thread_id == thread_id, runs.c.status == "queued", runs.c.id != after)
            .order_by(runs.c.created_at, runs.c.id)
            .limit(1)
        ).first()
        return run_from_row(row) if row is not None else None

    def list_runs(
        self,
        *,
        thread_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 100,
        tenant: str | None = None,
    ) -> list[Run]:
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        if thread_id is not None:
            query = query.where(runs.c.thread_id == thread_id)
        if tenant is not None:
            query = query.where(runs.c.thread_id.in_(select(threads.c.id).where(threads.c.tenant == tenant)))
        if statuses:
            query = query.where(runs.c.status.in_(list(statuses)))
        return [run_from_row(row) for row in self.conn.execute(query)]

    def claim_run(self, run_id: str, *, fence: int, owner: str, lease_until: datetime, now: datetime) -> int | None:
        """Take the run's lease; returns the new fence, or None if the fence moved."""
        return self.conn.execute(
            statements.CLAIM_RUN,
            {"b_id": run_id, "b_fence": fence, "b_owner": owner, "b_until": lease_until, "b_now": now, "b_now2": now},
        ).scalar()

    def count_voided(self, run_id: str, step: int, voided: int) -> None:
        """Record that ``voided`` attempts of ``run_id``'s model ``step`` were voided after they may
        have reached the provider (see :func:`~threads_celery.decisions.usage.voided_after_claim`)."""
        self.conn.execute(update(runs).where(runs.c.id == run_id).values(voided_step=step, voided_requests=voided))

    def count_lost_step(self, run_id: str, step: int, *, owner: str, now: datetime) -> None:
        """The worker process ``owner`` running ``run_id``'s model ``step`` was lost: one more time
        in a row for that step (a loss while running another step starts the count again), and
        the run's lease ends now if that process held it (it will not renew it)."""
        self.conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.step == step, runs.c.status.in_(["queued", "running"]))
            .values(
                lost_times=case((runs.c.lost_step == step, runs.c.lost_times + 1), else_=1),
                lost_step=step,
                lease_expires_at=case((runs.c.lease_owner == owner, now), else_=runs.c.lease_expires_at),
            )
        )

    def count_lost_call(self, effect_key: str, *, owner: str, now: datetime) -> None:
        """The worker process ``owner`` running the call was lost: one more time while the call is
        unsettled, and the call's and its run's leases end now where that process held them."""
        run_id = self.conn.execute(
            update(tool_calls)
            .where(tool_calls.c.effect_key == effect_key, tool_calls.c.status.in_(UNSETTLED_STATUSES))
            .values(
                lost_times=tool_calls.c.lost_times + 1,
                lease_expires_at=case((tool_calls.c.lease_owner == owner, now), else_=tool_calls.c.lease_expires_at),
            )
            .returning(tool_calls.c.run_id)
        ).scalar()
        if run_id is not None:
            self.conn.execute(
                update(runs).where(runs.c.id == run_id, runs.c.lease_owner == owner).values(lease_expires_at=now)
            )

    def extend_run_lease(self, run_id: str, *, fence: int, owner: str, lease_until: datetime) -> bool:
        result = self.conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.fence == fence, runs.c.lease_owner == owner)
            .values(lease_expires_at=lease_until)
        )
        return result.rowcount == 1

    def advance_run(self, run_id: str, *, fence: int, now: datetime, **values: Any) -> int | None:
        """Write a transition of the run if ``fence`` still holds; returns the new fence.

        A change of status is also appended to the thread's event log.
        """
        columns = tuple(sorted(values))
        params = {"b_id": run_id, "b_fence": fence, "b_now": now, **{f"v_{k}": v for k, v in values.items()}}
        row = self.conn.execute(statements.advance_run(columns), params).first()
        if row is None:
            return None
        if "status" in values:
            payload = {"run_id": run_id, "status": values["status"]}
            for key in ("output", "error"):
                if values.get(key) is not None:
                    payload[key] = values[key]
            self.append_event(row.thread_id, run_id, "run", payload, now)
        return int(row.fence)

    def expired_runs(self, *, now: datetime, limit: int) -> list[Run]:
        """Running runs whose driver stopped renewing its lease, locked with SKIP LOCKED."""
        query = (
            select(runs)
            .where(runs.c.status == "running", runs.c.lease_expires_at < now)
            .order_by(runs.c.lease_expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [run_from_row(row) for row in self.conn.execute(query)]

    # -- a tool call's claim and result -----------------------------------------------------

    def claim_call_and_run(
        self, run_id: str, effect_key: str, *, fence: int, owner: str, lease_until: datetime, now: datetime
    ) -> int | None:
        """Claim a call for ``owner``, fenced; the run's new fence, or None (nothing written).

        Writes, all or nothing: the run's lease and next fence, the call started (the evidence
        that its effect may have happened) and its outbox row consumed. On PostgreSQL that is
        one statement (atomic even in :meth:`Store.autocommit`); elsewhere, three.
        """
        if self.dialect == "postgresql":
            params = claim_params(run_id, effect_key, fence=fence, owner=owner, lease_until=lease_until, now=now)
            return self.conn.execute(statements.CLAIM_CALL_PG, params).scalar()
        claimed = self.claim_run(run_id, fence=fence, owner=owner, lease_until=lease_until, now=now)
        if claimed is None:
            return None
        self.claim_call(effect_key, owner=owner, lease_until=lease_until, now=now)
        self.delete_outbox(effect_key)
        return claimed

    def commit_call_result(
        self,
        *,
        run_id: str,
        thread_id: str,
        fence: int,
        call: CallRow,
        content: str,
        is_error: bool,
        own_outbox: bool,
        next_entry: OutboxEntry | None,
        now: datetime,
        resume: bool = False,
        kind: str | None = None,
    ) -> int | None:
        """Commit a tool call's result, fenced; the run's new fence, or None (nothing written).

        Writes, all or nothing: the run's next fence (its lease released; with ``resume``, a run
        that waited for a person is running again), the call settled, the tool message and its
        event, the call's own outbox row consumed (``own_outbox``; a claim consumed it already
        otherwise) and the outbox row of ``next_entry``, the task that runs next (None: the
        caller records what follows, e.g. the run's finish). On PostgreSQL that is one statement
        (one round trip, and atomic even in :meth:`Store.autocommit`), except for ``resume``,
        whose change of status is also logged as an event; elsewhere, one statement per row.
        """
        if self.dialect == "postgresql" and not resume:
            return self._commit_call_result_in_one(
                run_id,
                thread_id,
                fence,
                call,
                content,
                is_error=is_error,
                own_outbox=own_outbox,
                next_entry=next_entry,
                now=now,
                kind=kind,
            )
        changes: dict[str, Any] = {"status": "running"} if resume else {}
        moved = self.advance_run(run_id, fence=fence, now=now, lease_owner=None, lease_expires_at=None, **changes)
        if moved is None:
            return None
        status = "error" if is_error else "completed"
        self.settle_call(call.effect_key, status=status, result=content, is_error=is_error, now=now)
        self.insert_message(
            thread_id=thread_id,
            run_id=run_id,
            role="tool",
            text=content,
            now=now,
            tool_result=ToolResult(call_id=call.call_id, name=call.tool, content=content, is_error=is_error, kind=kind),
        )
        if own_outbox:
            self.delete_outbox(call.effect_key)
        if next_entry is not None:
            self.insert_outbox(next_entry, now)
        return moved

    def _commit_call_result_in_one(
        self,
        run_id: str,
        thread_id: str,
        fence: int,
        call: CallRow,
        content: str,
        *,
        is_error: bool,
        own_outbox: bool,
        next_entry: OutboxEntry | None,
        now: datetime,
        kind: str | None = None,
    ) -> int | None:
        """PostgreSQL: :meth:`commit_call_result` as the one statement COMMIT_CALL_RESULT_PG."""
        params = commit_result_params(
            run_id=run_id,
            thread_id=thread_id,
            fence=fence,
            call=call,
            content=content,
            is_error=is_error,
            own_outbox=own_outbox,
            next_entry=next_entry,
            now=now,
            next_due=now + self._outbox_grace(next_entry.task if next_entry is not None else ""),
            kind=kind,
        )
        return self.conn.execute(statements.COMMIT_CALL_RESULT_PG, params).scalar()

    # -- variables ---------------------------------------------------------------------------

    def set_variable(self, thread_id: str, name: str, type: str, value: str, now: datetime) -> None:
        updated = self.conn.execute(
            update(variables)
            .where(variables.c.thread_id == thread_id, variables.c.name == name)
            .values(type=type, value=value, updated_at=now)
        )
        if updated.rowcount == 0:
            self.conn.execute(
                insert(variables).values(thread_id=thread_id, name=name, type=type, value=value, updated_at=now)
            )

    def thread_variables(self, thread_id: str) -> dict[str, tuple[str, str]]:
        """The thread's own values: name -> (type, stored value)."""
        rows = self.conn.execute(
            select(variables.c.name, variables.c.type, variables.c.value).where(variables.c.thread_id == thread_id)
        )
        return {row.name: (row.type, row.value) for row in rows}

    def thread_chain(self, thread_id: str) -> list[tuple[str, str]]:
        """(thread id, agent) from the thread up to its root."""
        chain: list[tuple[str, str]] = []
        current: str | None = thread_id
        while current is not None and len(chain) < 64:
            row = self.conn.execute(
                select(threads.c.id, threads.c.agent, threads.c.parent_thread_id).where(threads.c.id == current)
            ).first()
            if row is None:
                break
            chain.append((row.id, row.agent))
            current = row.parent_thread_id
        return chain

    def agent_description(self, name: str) -> dict[str, Any] | None:
        return self.conn.execute(select(agents.c.description).where(agents.c.name == name)).scalar()


__all__ = ["Store", "Tx", "args_digest"]
