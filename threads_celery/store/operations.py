"""A worker's hot-path operations, each running on its own (a part of :class:`~.repository.Store`).

A tool call's read, claim and result commit, a model step's read and claim, and an event no
other write depends on: each is one statement on PostgreSQL, atomic by itself, run in
autocommit on the driver's cursor (:mod:`.direct`); elsewhere, one transaction holds the
statements that make it up. Each writes nothing once the run's fence has moved.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from threads_celery.records import CallRow, Message, OutboxEntry, Run, ToolCall, ToolResult
from threads_celery.store import statements
from threads_celery.store.call_queries import CALL_RUN_AND_NEXT_HOT, call_and_run_from_mapping
from threads_celery.store.direct import DirectStatements
from threads_celery.store.outbox_queries import TOOL_TASK_NAME
from threads_celery.store.rows import message_from_mapping, messages_from_json, run_from_mapping
from threads_celery.store.storable import dumps

if TYPE_CHECKING:
    from threads_celery.store.repository import Tx

#: What fills the one-statement result commit's next-task parameters when there is no next task
#: (its ``has_next`` is false, so none of it is written).
_NO_NEXT_ENTRY = OutboxEntry(key="", task="")


#: ``history_ends`` that read a thread's whole history: every message from seq 0 on.
WHOLE_HISTORY = (-1, 0)


@dataclass(frozen=True)
class ClaimedStep:
    """A step read and claimed in one statement: the run as it was before the claim, and its
    thread's messages read with it (those ``history_ends`` asked for), but for the ends found
    ``unchanged`` (their version still the one the step's cache holds); ``versions``: each message
    read's row version."""

    run: Run
    history_ends: tuple[int, int]
    messages: list[Message]
    versions: dict[int, str] = field(default_factory=dict)
    unchanged: frozenset[int] = frozenset()


def _lease_live(run: Run, now: datetime) -> bool:
    """CLAIM_STEP_PG's lease condition, negated: another worker's lease has not expired."""
    return run.lease_owner is not None and run.lease_expires_at is not None and run.lease_expires_at > now


def claim_params(
    run_id: str, effect_key: str, *, fence: int, owner: str, lease_until: datetime, now: datetime
) -> dict[str, Any]:
    """The parameters of CLAIM_CALL_PG."""
    return {
        "run_id": run_id,
        "effect_key": effect_key,
        "fence": fence,
        "owner": owner,
        "until": lease_until,
        "now": now,
    }


def commit_result_params(
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
    next_due: datetime,
    kind: str | None = None,
) -> dict[str, Any]:
    """The parameters of COMMIT_CALL_RESULT_PG (``next_due``: when the next task counts as lost)."""
    tool_result = ToolResult(call_id=call.call_id, name=call.tool, content=content, is_error=is_error, kind=kind)
    parts = {"tool_result": tool_result.to_json()}
    following = next_entry or _NO_NEXT_ENTRY
    return {
        "now": now,
        "run_id": run_id,
        "fence": fence,
        "status": "error" if is_error else "completed",
        "content": content,
        "is_error": is_error,
        "effect_key": call.effect_key,
        "thread_id": thread_id,
        "parts": dumps(parts),
        "own_outbox": own_outbox,
        "has_next": next_entry is not None,
        "next_key": following.key,
        "next_task": following.task,
        "next_args": dumps(list(following.args)),
        "next_queue": following.queue,
        "next_argsrepr": following.argsrepr,
        "next_due": next_due,
    }


class OwnOperations:
    """The hot path's operations of their own; mixed into the store."""

    _direct: DirectStatements | None
    step_grace: timedelta
    tool_grace: timedelta
    #: Every commit waits for its WAL to reach disk, even those that need not (see _NO_FLUSH_WAIT
    #: in :mod:`.statements`): THREADS_FLUSH_EVERY_COMMIT.
    flush_every_commit: bool

    def transaction(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def read(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

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
        next_entry: OutboxEntry,
        now: datetime,
        kind: str | None = None,
        wait_for_flush: bool = True,
    ) -> int | None:
        """:meth:`Tx.commit_call_result` in a transaction of its own: a worker's hot path.

        On PostgreSQL the commit is one statement, run in autocommit on the driver's cursor
        (:mod:`.direct`): one round trip, with no BEGIN or COMMIT; with ``wait_for_flush`` false
        (a read_only call's result) it returns before its WAL reaches disk, unless
        :attr:`flush_every_commit`. Elsewhere, one transaction.
        """
        if self._direct is not None:
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
                next_due=now + (self.tool_grace if next_entry.task == TOOL_TASK_NAME else self.step_grace),
                kind=kind,
            )
            statement = (
                statements.COMMIT_CALL_RESULT_PG
                if wait_for_flush or self.flush_every_commit
                else statements.COMMIT_CALL_RESULT_NO_FLUSH_WAIT_PG
            )
            fenced: int | None = self._direct.scalar(statement, params)
            return fenced
        with self.transaction() as tx:
            return tx.commit_call_result(
                run_id=run_id,
                thread_id=thread_id,
                fence=fence,
                call=call,
                content=content,
                is_error=is_error,
                own_outbox=own_outbox,
                next_entry=next_entry,
                now=now,
                kind=kind,
            )

    def claim_call_and_run(
        self, run_id: str, effect_key: str, *, fence: int, owner: str, lease_until: datetime, now: datetime
    ) -> int | None:
        """:meth:`Tx.claim_call_and_run` in a transaction of its own (one statement in autocommit on
        PostgreSQL, on the driver's cursor)."""
        if self._direct is not None:
            params = claim_params(run_id, effect_key, fence=fence, owner=owner, lease_until=lease_until, now=now)
            claimed: int | None = self._direct.scalar(statements.CLAIM_CALL_PG, params)
            return claimed
        with self.transaction() as tx:
            return tx.claim_call_and_run(run_id, effect_key, fence=fence, owner=owner, lease_until=lease_until, now=now)

    def append_event(
        self, thread_id: str, run_id: str | None, type: str, payload: dict[str, Any], now: datetime
    ) -> int:
        """:meth:`Tx.append_event` on its own (one statement in autocommit on PostgreSQL, on the
        driver's cursor): an event no other write depends on, such as ``tool_call_started``, so
        its commit does not wait for the disk (unless :attr:`flush_every_commit`)."""
        if self._direct is not None:
            params = {"b_thread": thread_id, "b_run": run_id, "b_type": type, "b_payload": payload, "b_now": now}
            statement = (
                statements.APPEND_EVENT_PG if self.flush_every_commit else statements.APPEND_EVENT_NO_FLUSH_WAIT_PG
            )
            return int(self._direct.scalar(statement, params))
        with self.transaction() as tx:
            return tx.append_event(thread_id, run_id, type, payload, now)

    def run(self, run_id: str) -> Run | None:
        """The run's row, read on its own (unlocked): a worker's hot path."""
        if self._direct is not None:
            row = self._direct.first(statements.GET_RUN, {"b_id": run_id})
            return None if row is None else run_from_mapping(row)
        with self.read() as tx:
            return tx.get_run(run_id)

    def read_and_claim_step(
        self,
        run_id: str,
        step: int,
        step_key: str,
        *,
        owner: str,
        lease_until: datetime,
        now: datetime,
        history_ends: tuple[int, int] = WHOLE_HISTORY,
        history_versions: tuple[str | None, str | None] = (None, None),
    ) -> ClaimedStep | None:
        """On PostgreSQL, a due step's read and claim in one statement (READ_AND_CLAIM_STEP_PG):
        the run as it was before the claim (the claim's fence is one more; without its input,
        output and error, ``statements.RUN_TEXT_COLUMNS``) and its thread's messages, or None,
        with nothing written, when the step is not due, another worker's lease is live, a call
        of the step before has not settled, or this is not PostgreSQL:
        then :meth:`run`, :meth:`unsettled_call` and :meth:`claim_step`, apart, say why.
        ``history_ends``: the first and last seq of the history a step has cached (the messages
        read are those two and every one after the last), or :data:`WHOLE_HISTORY`;
        ``history_versions``: the row versions the cache holds of those two, if it knows them.

        The claim does not wait for the disk (unless :attr:`flush_every_commit`): a crash of
        PostgreSQL that takes it back lets the step run again, as a worker's death does, and
        the reply's commit, which waits, makes it durable with everything before it."""
        if self._direct is None:
            return None
        first_seq, last_seq = history_ends
        params = {
            "run_id": run_id,
            "step": step,
            "step_key": step_key,
            "owner": owner,
            "until": lease_until,
            "now": now,
            "payload": {"run_id": run_id, "status": "running"},
            "first_seq": first_seq,
            "last_seq": last_seq,
            "first_version": history_versions[0],
            "last_version": history_versions[1],
        }
        statement = (
            statements.READ_AND_CLAIM_STEP_PG
            if self.flush_every_commit
            else statements.READ_AND_CLAIM_STEP_NO_FLUSH_WAIT_PG
        )
        row = self._direct.first(statement, params)
        if row is None:
            return None
        items: list[dict[str, Any]] = row["history"] or []
        read = [item for item in items if not item.get("unchanged")]
        return ClaimedStep(
            run_from_mapping(row),
            history_ends,
            messages_from_json(read),
            versions={item["seq"]: item["row_version"] for item in read},
            unchanged=frozenset(item["seq"] for item in items if item.get("unchanged")),
        )

    def unsettled_call(self, run_id: str, step: int) -> str | None:
        """The effect key of a call of ``run_id``'s ``step`` that waits to run or runs, if any
        (read on its own): a step's delivery that finds one was published by a result that a
        crash of PostgreSQL took back."""
        params = {"b_run": run_id, "b_step": step}
        key: str | None
        if self._direct is not None:
            key = self._direct.scalar(statements.UNSETTLED_CALL, params)
            return key
        with self.read() as tx:
            key = tx.conn.execute(statements.UNSETTLED_CALL, params).scalar()
            return key

    def list_messages(self, thread_id: str) -> list[Message]:
        """The thread's whole history, in order, read on its own: a model step's cache miss."""
        if self._direct is not None:
            rows = self._direct.rows(statements.THREAD_MESSAGES, {"b_thread": thread_id})
            return [message_from_mapping(row) for row in rows]
        with self.read() as tx:
            return tx.list_messages(thread_id)

    def list_message_ends(self, thread_id: str, *, first_seq: int, last_seq: int) -> list[Message]:
        """:meth:`Tx.list_message_ends` read on its own: how a model step's cached history is checked
        and extended (one statement in autocommit on PostgreSQL, on the driver's cursor)."""
        if self._direct is not None:
            params = {"b_thread": thread_id, "b_first": first_seq, "b_last": last_seq}
            return [message_from_mapping(row) for row in self._direct.rows(statements.MESSAGE_ENDS, params)]
        with self.read() as tx:
            return tx.list_message_ends(thread_id, first_seq=first_seq, last_seq=last_seq)

    def claim_step(self, run: Run, step_key: str, *, owner: str, lease_until: datetime, now: datetime) -> int | None:
        """Take ``run``'s lease for a model step, fenced on the run as read; the new fence, or None.

        Writes, all or nothing: the run's lease and next fence (it is ``running`` from now on),
        the step's outbox row consumed and, for a run that was queued, its ``running`` event.
        Nothing is written if the run's fence moved since ``run`` was read or another worker's
        lease is live. On PostgreSQL that is one statement in autocommit (on the driver's
        cursor); elsewhere, one transaction.
        """
        was_queued = run.status == "queued"
        payload = {"run_id": run.id, "status": "running"}
        if self._direct is not None:
            params = {
                "run_id": run.id,
                "thread_id": run.thread_id,
                "step": run.step,
                "step_key": step_key,
                "fence": run.fence,
                "owner": owner,
                "until": lease_until,
                "now": now,
                "was_queued": was_queued,
                "payload": payload,
            }
            claimed: int | None = self._direct.scalar(statements.CLAIM_STEP_PG, params)
            return claimed
        with self.transaction() as tx:
            current = tx.get_run(run.id, lock=True)
            if current is None or current.fence != run.fence or _lease_live(current, now):
                return None
            fence = tx.claim_run(run.id, fence=run.fence, owner=owner, lease_until=lease_until, now=now)
            if fence is not None:
                if current.lease_owner is not None:  # what CLAIM_STEP_PG's _COUNT_VOIDED writes
                    tx.count_voided(run.id, run.step, current.voided_after_claim(run.step))
                tx.delete_outbox(step_key)
                if was_queued:
                    tx.append_event(run.thread_id, run.id, "run", payload, now)
            return fence

    def delete_outbox(self, key: str) -> None:
        """Consume an outbox row on its own (a delivery that found nothing to do)."""
        with self.transaction() as tx:
            tx.delete_outbox(key)

    def call_and_run(self, effect_key: str) -> tuple[CallRow, Run] | None:
        """:meth:`Tx.get_call_and_run` (unlocked) as a read of its own, as a tool call's delivery
        reads it: the run without its input, output and error (``statements.RUN_TEXT_COLUMNS``)."""
        params = {"b_key": effect_key}
        if self._direct is not None:
            row = self._direct.first(CALL_RUN_AND_NEXT_HOT, params)
            return None if row is None else call_and_run_from_mapping(row)
        with self.read() as tx:
            found = tx.conn.execute(CALL_RUN_AND_NEXT_HOT, params).first()
            return None if found is None else call_and_run_from_mapping(found._mapping)

    def commit_reply(self, reply: Reply) -> int | None:
        """Commit a model step's reply that asks for tool calls, fenced; the new fence, or None.

        Writes, all or nothing: the run moved to its next step (its lease released), the step's
        usage, the ``tool_call_started`` events it held, the assistant message and its event, the
        calls' ledger rows and the outbox rows of what runs first. On PostgreSQL that is one statement in autocommit, on the driver's
        cursor; elsewhere, one transaction (:func:`commit_reply_in`).
        """
        if self._direct is None:
            with self.transaction() as tx:
                return commit_reply_in(tx, reply)
        if any(entry.task != TOOL_TASK_NAME for entry in reply.entries):
            raise ValueError("a reply's first tasks are tool calls (their outbox rows share one due time)")
        parts = {"tool_calls": [c.to_json() for c in reply.tool_calls]}
        params = {
            **_reply_params(reply),
            "parts": dumps(parts),
            "calls_in_step": len(reply.call_rows),
            "calls": dumps([{k: row[k] for k in _CALL_ROW_FIELDS} for row in reply.call_rows]),
            "entries": dumps([_entry_json(entry) for entry in reply.entries]),
            "due": reply.now + self.tool_grace,
            "started": dumps(list(reply.started)),
            "started_count": len(reply.started),
        }
        fenced: int | None = self._direct.scalar(statements.COMMIT_REPLY_PG, params)
        return fenced

    @property
    def starts_in_one_statement(self) -> bool:
        """Whether :meth:`start_run_on_new_thread` is available (PostgreSQL, direct statements)."""
        return self._direct is not None

    def start_run_on_new_thread(
        self,
        *,
        agent: str,
        config_hash: str | None,
        message: str,
        thread_id: str,
        run_id: str,
        tenant: str,
        traceparent: str | None,
        step_entry: OutboxEntry,
        now: datetime,
    ) -> tuple[str, str | None] | None:
        """A run on a new thread, active at once, its first step in the outbox, as one statement
        (START_RUN_PG); the agent's recorded config hash and queue, or None (nothing written)
        when no worker or client registered the agent. ``step_entry``'s queue is not read: the
        row takes the agent's recorded one, which comes back. PostgreSQL only
        (:attr:`starts_in_one_statement`)."""
        if self._direct is None:
            raise RuntimeError("start_run_on_new_thread needs PostgreSQL's direct statements")
        params = {
            "agent": agent,
            "config_hash": config_hash,
            "thread_id": thread_id,
            "run_id": run_id,
            "tenant": tenant,
            "input": message,
            "traceparent": traceparent,
            "now": now,
            "due": now + self.step_grace,
            "run_payload": dumps({"run_id": run_id, "status": "queued", "agent": agent}),
            "step_key": step_entry.key,
            "step_task": step_entry.task,
            "step_args": dumps(list(step_entry.args)),
            "step_argsrepr": step_entry.argsrepr,
        }
        row = self._direct.first(statements.START_RUN_PG, params)
        if row is None:
            return None
        return str(row["0"]), row["1"]


#: The per-call fields of a reply's call rows that COMMIT_REPLY_PG reads from ``:calls``.
_CALL_ROW_FIELDS = (
    "effect_key", "idx", "call_id", "tool", "args", "args_hash", "effect", "dedup_window_ms", "finality", "queue",
    "batch",
)  # fmt: skip


def _entry_json(entry: OutboxEntry) -> dict[str, Any]:
    return {"key": entry.key, "task": entry.task, "args": list(entry.args), "queue": entry.queue,
            "argsrepr": entry.argsrepr}  # fmt: skip


@dataclass(frozen=True)
class StepUsage:
    """One model step's usage, as the step records it: its requests (the one that committed and
    those voided before it, see :meth:`~threads_celery.records.Run.voided_after_claim`) and their tokens."""

    agent: str
    model: str
    input_tokens: int
    output_tokens: int
    cost: float | None
    requests: int = 1


@dataclass(frozen=True)
class Reply:
    """A model step's reply, ready to commit: one that asks for tool calls, or one that ends the
    run (its calls, rows and entries empty)."""

    run_id: str
    thread_id: str
    fence: int
    step: int
    now: datetime
    usage: StepUsage
    text: str
    tool_calls: tuple[ToolCall, ...]
    #: One ledger row per call (the columns of ``tool_calls`` a new call has).
    call_rows: tuple[dict[str, Any], ...]
    #: What runs first: the first call, or the first wave of a concurrent group.
    entries: tuple[OutboxEntry, ...]
    #: The payloads of ``tool_call_started`` events the step held back while the model streamed
    #: (see ``Runtime._run_step``): recorded with the reply, before its message's event.
    started: tuple[dict[str, Any], ...] = ()


def commit_reply_in(tx: Tx, reply: Reply) -> int | None:
    """:meth:`OwnOperations.commit_reply` as statements of ``tx`` (nothing written on a moved fence)."""
    moved = _step_and_message(tx, reply)
    if moved is None:
        return None
    tx.insert_tool_calls(list(reply.call_rows))
    for entry in reply.entries:
        tx.insert_outbox(entry, reply.now)
    return moved


def commit_last_reply_in(tx: Tx, reply: Reply) -> int | None:
    """Commit in ``tx`` a reply that ends its run; the new fence, or None (nothing written).

    Writes, all or nothing: the run moved to its next step and ``completed`` with the reply as
    its output (fenced, its lease released), the step's usage, the assistant message and its
    event, and the run's ``completed`` event. What follows a run's end (the thread handed on:
    :func:`threads_celery.transitions.runs.finished`) is the caller's, in the same transaction,
    which the writes here have locked the run and the thread for. On PostgreSQL that is one
    statement; elsewhere the statements of :func:`commit_reply_in`, then the run's end.
    """
    if reply.tool_calls or reply.call_rows or reply.entries:
        raise ValueError("a reply that ends its run asks for no tool calls")
    if tx.dialect != "postgresql" or reply.started:  # started events: an output tool's, rarely
        moved = _step_and_message(tx, reply)
        if moved is None:
            return None
        return tx.advance_run(
            reply.run_id, fence=moved, now=reply.now, status="completed", output=reply.text,
            finished_at=reply.now, lease_owner=None, lease_expires_at=None,
        )  # fmt: skip
    params = {
        **_reply_params(reply),
        "parts": None,
        "run_payload": dumps({"run_id": reply.run_id, "status": "completed", "output": reply.text}),
    }
    fenced = tx.conn.execute(statements.COMMIT_LAST_REPLY_PG, params).scalar()
    return None if fenced is None else int(fenced)


def _reply_params(reply: Reply) -> dict[str, Any]:
    """The parameters a one-statement reply commit shares: the fenced run, the step and its usage, the text."""
    return {
        "run_id": reply.run_id,
        "thread_id": reply.thread_id,
        "fence": reply.fence,
        "step": reply.step,
        "next_step": reply.step + 1,
        "now": reply.now,
        "agent": reply.usage.agent,
        "model": reply.usage.model[:255],
        "requests": reply.usage.requests,
        "input_tokens": reply.usage.input_tokens,
        "output_tokens": reply.usage.output_tokens,
        "cost": reply.usage.cost,
        "text": reply.text,
    }


def _step_and_message(tx: Tx, reply: Reply) -> int | None:
    """The run moved to its next step (fenced, its lease released), the step's usage and the
    assistant message: the new fence, or None (nothing written)."""
    moved = tx.advance_run(
        reply.run_id, fence=reply.fence, now=reply.now, step=reply.step + 1, lease_owner=None, lease_expires_at=None
    )
    if moved is None:
        return None
    for payload in reply.started:  # after the run's lock, before the message's event
        tx.append_event(reply.thread_id, reply.run_id, "tool_call_started", payload, reply.now)
    usage = reply.usage
    tx.record_usage(
        run_id=reply.run_id,
        step=reply.step,
        thread_id=reply.thread_id,
        agent=usage.agent,
        model=usage.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost=usage.cost,
        now=reply.now,
        requests=usage.requests,
    )
    tx.insert_message(
        thread_id=reply.thread_id,
        run_id=reply.run_id,
        role="assistant",
        text=reply.text,
        now=reply.now,
        tool_calls=reply.tool_calls,
    )
    return moved
