"""The named queries of messages and the event log (a part of :class:`~.repository.Tx`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from threads_celery.records import Event, Message, ToolCall, ToolResult
from threads_celery.store import statements
from threads_celery.store.rows import message_from_row
from threads_celery.store.schema import events, messages


class MessageQueries:
    """Queries over ``messages`` and ``events``; mixed into the transaction."""

    conn: Connection
    dialect: str
    event_threads: set[str]

    # -- messages ----------------------------------------------------------------------------

    def next_seq(self, thread_id: str) -> int:
        last = self.conn.execute(select(func.max(messages.c.seq)).where(messages.c.thread_id == thread_id)).scalar()
        return 0 if last is None else int(last) + 1

    def insert_message(
        self,
        *,
        thread_id: str,
        run_id: str | None,
        role: str,
        text: str,
        now: datetime,
        seq: int | None = None,
        tool_calls: Sequence[ToolCall] = (),
        tool_result: ToolResult | None = None,
        key: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Append a message (at the thread's next sequence number unless ``seq`` is given)."""
        parts: dict[str, Any] | None = None
        if tool_calls:
            parts = {"tool_calls": [c.to_json() for c in tool_calls]}
        elif tool_result is not None:
            parts = {"tool_result": tool_result.to_json()}
        values = {
            "run_id": run_id,
            "role": role,
            "text": text,
            "parts": parts,
            "key": key,
            "meta": meta,
            "created_at": now,
        }
        if seq is None:
            seq = int(self.conn.execute(statements.INSERT_NEXT_MESSAGE, {"b_thread": thread_id, **values}).scalar_one())
        else:
            self.conn.execute(insert(messages).values(thread_id=thread_id, seq=seq, **values))
        payload: dict[str, Any] = {"seq": seq, "role": role, "text": text, **(parts or {})}
        if meta:
            payload["meta"] = meta
        self.append_event(thread_id, run_id, "message", payload, now)
        return seq

    # -- events ------------------------------------------------------------------------------

    def append_event(
        self, thread_id: str, run_id: str | None, type: str, payload: dict[str, Any], now: datetime
    ) -> int:
        """Append to the thread's event log; returns the event's sequence number."""
        self.event_threads.add(thread_id)
        if self.dialect == "postgresql":
            params = {"b_thread": thread_id, "b_run": run_id, "b_type": type, "b_payload": payload, "b_now": now}
            return int(self.conn.execute(statements.APPEND_EVENT_PG, params).scalar_one())
        seq = self.conn.execute(statements.BUMP_EVENT_SEQ, {"b_thread": thread_id}).scalar_one()
        self.conn.execute(
            statements.INSERT_EVENT,
            {"thread_id": thread_id, "seq": seq, "run_id": run_id, "type": type, "payload": payload, "created_at": now},
        )
        return int(seq)

    def last_event_of(self, thread_id: str, run_id: str, type: str) -> dict[str, Any] | None:
        """The payload of the run's latest event of ``type`` in the thread's log, or None."""
        payload = self.conn.execute(
            select(events.c.payload)
            .where(events.c.thread_id == thread_id, events.c.run_id == run_id, events.c.type == type)
            .order_by(events.c.seq.desc())
            .limit(1)
        ).scalar()
        return dict(payload) if isinstance(payload, dict) else None

    def list_events(self, thread_id: str, *, after: int = 0, limit: int = 500) -> list[Event]:
        rows = self.conn.execute(
            select(events)
            .where(events.c.thread_id == thread_id, events.c.seq > after)
            .order_by(events.c.seq)
            .limit(limit)
        )
        return [
            Event(
                thread_id=row.thread_id,
                seq=int(row.seq),
                type=row.type,
                payload=row.payload,
                run_id=row.run_id,
                created_at=row.created_at,
            )
            for row in rows
        ]

    def message_key_exists(self, thread_id: str, key: str) -> bool:
        return (
            self.conn.execute(
                select(messages.c.id).where(messages.c.thread_id == thread_id, messages.c.key == key)
            ).first()
            is not None
        )

    def list_message_ends(self, thread_id: str, *, first_seq: int, last_seq: int) -> list[Message]:
        """The message at ``first_seq`` and those from ``last_seq`` on, in order (two index ranges)."""
        params = {"b_thread": thread_id, "b_first": first_seq, "b_last": last_seq}
        return [message_from_row(row) for row in self.conn.execute(statements.MESSAGE_ENDS, params)]

    def list_messages(
        self, thread_id: str, *, after: int = -1, limit: int | None = None, include_superseded: bool = False
    ) -> list[Message]:
        """The thread's messages after ``after``, in order: its current branch, or with
        ``include_superseded`` every message it ever had (those left behind carry ``superseded_by``)."""
        query = (
            select(messages).where(messages.c.thread_id == thread_id, messages.c.seq > after).order_by(messages.c.seq)
        )
        if not include_superseded:
            query = query.where(messages.c.superseded_by.is_(None))
        if limit is not None:
            query = query.limit(limit)
        return [message_from_row(row) for row in self.conn.execute(query)]
