"""The named queries of tool calls (a part of :class:`~.repository.Tx`), and the read of a call with its run.

A call's row is its ledger entry: inserted with the model's reply, claimed when it starts (the
evidence that its effect may have happened), settled with its result. The result commit itself
spans the run, the call, the thread's messages and the outbox, and lives on the transaction
(:meth:`~.repository.Tx.commit_call_result`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, Text, bindparam, literal, null, select, update
from sqlalchemy.engine import Connection, RowMapping

from threads_celery.records import UNSETTLED_STATUSES, CallRow, Run
from threads_celery.store import statements
from threads_celery.store.rows import call_from_mapping, run_from_mapping
from threads_celery.store.schema import runs, tool_calls

_next = tool_calls.alias("nxt")
_previous = tool_calls.alias("prv")


def _run_columns_labelled(*, with_text: bool) -> list[ColumnElement[Any]]:
    return [
        c.label(f"r__{c.name}")
        if with_text or c.name not in statements.RUN_TEXT_COLUMNS
        else (literal("", Text) if c.name == "input" else null()).label(f"r__{c.name}")
        for c in runs.c
    ]


def _call_run_and_next(*, with_text: bool) -> Select[Any]:
    return (
        select(
            tool_calls,
            *_run_columns_labelled(with_text=with_text),
            _next.c.effect_key.label("n__effect_key"),
            _next.c.tool.label("n__tool"),
            _next.c.queue.label("n__queue"),
            _previous.c.status.label("p__status"),
        )
        .join(runs, runs.c.id == tool_calls.c.run_id)
        .outerjoin(
            _next,
            (_next.c.run_id == tool_calls.c.run_id)
            & (_next.c.step == tool_calls.c.step)
            & (_next.c.idx == tool_calls.c.idx + 1),
        )
        .outerjoin(
            _previous,
            (_previous.c.run_id == tool_calls.c.run_id)
            & (_previous.c.step == tool_calls.c.step)
            & (_previous.c.idx == tool_calls.c.idx - 1),
        )
        .where(tool_calls.c.effect_key == bindparam("b_key"))
    )


#: A call, its run, the call after it in the same model reply and the status of the call before
#: it, in one statement.
CALL_RUN_AND_NEXT = _call_run_and_next(with_text=True)
#: The same as a tool call's delivery reads it: the run without ``statements.RUN_TEXT_COLUMNS``.
CALL_RUN_AND_NEXT_HOT = _call_run_and_next(with_text=False)


def call_and_run_from_mapping(mapping: RowMapping | Mapping[str, Any]) -> tuple[CallRow, Run]:
    """The call and its run from a row of ``select(tool_calls, r__<run column>...)``, with the
    call after it in the same reply and the status of the one before when the row carries ``n__``
    and ``p__`` columns (CALL_RUN_AND_NEXT)."""
    run_values = {name: mapping[label] for name, label in _RUN_LABELS}
    following = mapping.get("n__effect_key")
    next_call = None if following is None else (following, mapping["n__tool"], mapping["n__queue"])
    previous_unsettled = mapping.get("p__status") in UNSETTLED_STATUSES
    call = call_from_mapping(mapping, next_call=next_call, previous_unsettled=previous_unsettled)
    return call, run_from_mapping(run_values)


#: Each run column and its label in a call's row (``r__<name>``).
_RUN_LABELS = tuple((c.name, f"r__{c.name}") for c in runs.c)


class CallQueries:
    """Queries over ``tool_calls``; mixed into the transaction."""

    conn: Connection

    def insert_tool_calls(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            self.conn.execute(statements.INSERT_TOOL_CALLS, list(rows))

    def get_call_and_run(self, effect_key: str, *, lock: bool = False) -> tuple[CallRow, Run] | None:
        """The call's ledger row (with the next call of its reply) and its run's row, in one statement."""
        if lock:
            query = (
                select(tool_calls, *[c.label(f"r__{c.name}") for c in runs.c])
                .join(runs, runs.c.id == tool_calls.c.run_id)
                .where(tool_calls.c.effect_key == effect_key)
                .with_for_update()
            )
            row = self.conn.execute(query).first()
        else:
            row = self.conn.execute(CALL_RUN_AND_NEXT, {"b_key": effect_key}).first()
        return None if row is None else call_and_run_from_mapping(row._mapping)

    def calls_in_step(self, run_id: str, step: int) -> list[CallRow]:
        rows = self.conn.execute(
            select(tool_calls)
            .where(tool_calls.c.run_id == run_id, tool_calls.c.step == step)
            .order_by(tool_calls.c.idx)
        )
        return [call_from_mapping(row._mapping) for row in rows]

    def get_next_call(self, run_id: str, step: int, index: int) -> CallRow:
        row = self.conn.execute(
            select(tool_calls).where(
                tool_calls.c.run_id == run_id, tool_calls.c.step == step, tool_calls.c.idx == index
            )
        ).one()
        return call_from_mapping(row._mapping)

    def extend_call_lease(self, effect_key: str, lease_until: datetime) -> None:
        self.conn.execute(
            update(tool_calls)
            .where(tool_calls.c.effect_key == effect_key, tool_calls.c.status == "started")
            .values(lease_expires_at=lease_until)
        )

    def claim_call(self, effect_key: str, *, owner: str, lease_until: datetime, now: datetime) -> None:
        """Record that the call is starting: the evidence that its effect may have happened."""
        self.conn.execute(
            statements.CLAIM_CALL, {"b_key": effect_key, "b_owner": owner, "b_until": lease_until, "b_now": now}
        )

    def settle_call(self, effect_key: str, *, status: str, result: str, is_error: bool, now: datetime) -> None:
        self.conn.execute(
            statements.SETTLE_CALL,
            {"b_key": effect_key, "b_status": status, "b_result": result, "b_is_error": is_error, "b_now": now},
        )

    def keep_full_result(self, effect_key: str, result: str) -> None:
        """Keep a tool's whole result beside the shortened one the model is shown."""
        self.conn.execute(update(tool_calls).where(tool_calls.c.effect_key == effect_key).values(full_result=result))

    def tool_result(self, effect_key: str) -> tuple[str, str | None, str | None, bool] | None:
        """(status, shown result, whole result if it was shortened, is_error) of a call, or None."""
        row = self.conn.execute(
            select(tool_calls.c.status, tool_calls.c.result, tool_calls.c.full_result, tool_calls.c.is_error).where(
                tool_calls.c.effect_key == effect_key
            )
        ).first()
        return None if row is None else (row.status, row.result, row.full_result, bool(row.is_error))

    def update_call(self, effect_key: str, **values: Any) -> None:
        self.conn.execute(update(tool_calls).where(tool_calls.c.effect_key == effect_key).values(**values))

    def calls_with_status(self, status: str, *, limit: int = 200) -> list[CallRow]:
        rows = self.conn.execute(
            select(tool_calls).where(tool_calls.c.status == status).order_by(tool_calls.c.created_at).limit(limit)
        )
        return [call_from_mapping(row._mapping) for row in rows]

    def started_call(self, run_id: str, step: int) -> CallRow | None:
        row = self.conn.execute(
            select(tool_calls).where(
                tool_calls.c.run_id == run_id, tool_calls.c.step == step, tool_calls.c.status == "started"
            )
        ).first()
        return call_from_mapping(row._mapping) if row is not None else None

    def park_call(self, effect_key: str, *, reason: str) -> None:
        self.conn.execute(
            update(tool_calls)
            .where(tool_calls.c.effect_key == effect_key)
            .values(status="parked", park_reason=reason, lease_owner=None, lease_expires_at=None)
        )
