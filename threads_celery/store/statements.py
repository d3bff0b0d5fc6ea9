"""The hot path's statements, built once with bind parameters.

Building a Core statement on every call costs SQLAlchemy a construction and a cache-key walk
over all its parts each time; a statement built once here memoizes both, and its SQL is compiled
once per dialect. These are the statements every tool call and model step runs.
"""

from __future__ import annotations

from sqlalchemy import Boolean, bindparam, column, delete, func, insert, literal_column, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect

from threads_celery.records import UNSETTLED_STATUSES
from threads_celery.store.schema import UTCDateTime, agents, events, messages, outbox, runs, threads, tool_calls

#: Whether a run has a call of a step that has not settled: one that waits to run or is running.
UNSETTLED_CALL = (
    select(tool_calls.c.effect_key)
    .where(
        tool_calls.c.run_id == bindparam("b_run"),
        tool_calls.c.step == bindparam("b_step"),
        or_(*(tool_calls.c.status == status for status in UNSETTLED_STATUSES)),
    )
    .limit(1)
)

#: PostgreSQL: the CTE that lets a one-statement commit return before its WAL reaches disk
#: (``synchronous_commit`` off for the statement's own transaction only). For the commits whose
#: loss to a crash of PostgreSQL itself costs a repetition and nothing else: see
#: ``docs/production.md`` ("What waits for the disk"). The statement names it in its last FROM,
#: so that it is evaluated.
_NO_FLUSH_WAIT = "no_flush_wait AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)"


def _without_flush_wait(sql: str) -> str:
    """``sql`` (``WITH ...`` and a last ``FROM r``) with _NO_FLUSH_WAIT first and in its last FROM."""
    if not (sql.lstrip().startswith("WITH ") and sql.rstrip().endswith("FROM r")):
        raise ValueError("a statement made not to wait for the flush starts WITH and ends FROM r")
    return sql.replace("WITH ", f"WITH {_NO_FLUSH_WAIT}, ", 1).rstrip() + ", no_flush_wait\n"


#: A message whose sequence number is the thread's next, computed in the same statement.
INSERT_NEXT_MESSAGE = (
    insert(messages)
    .values(
        seq=select(func.coalesce(func.max(messages.c.seq), -1) + 1)
        .where(messages.c.thread_id == bindparam("b_thread"))
        .scalar_subquery(),
        thread_id=bindparam("b_thread"),
    )
    .returning(messages.c.seq)
)

#: A thread's message at ``b_first`` and its messages from ``b_last`` on (the history cache's check).
MESSAGE_ENDS = (
    select(messages)
    .where(
        messages.c.thread_id == bindparam("b_thread"),
        (messages.c.seq == bindparam("b_first")) | (messages.c.seq >= bindparam("b_last")),
        messages.c.superseded_by.is_(None),
    )
    .order_by(messages.c.seq)
)

#: A thread's whole history, in order: its current branch (a superseded message is not in it).
THREAD_MESSAGES = (
    select(messages)
    .where(messages.c.thread_id == bindparam("b_thread"), messages.c.superseded_by.is_(None))
    .order_by(messages.c.seq)
)

BUMP_EVENT_SEQ = (
    update(threads)
    .where(threads.c.id == bindparam("b_thread"))
    .values(event_seq=threads.c.event_seq + 1)
    .returning(threads.c.event_seq)
)

INSERT_EVENT = insert(events)

#: PostgreSQL: bump the thread's event counter and insert the event in one round trip.
_bumped = BUMP_EVENT_SEQ.cte("bumped")
_no_flush_wait = select(literal_column("set_config('synchronous_commit', 'off', true)").label("setting")).cte(
    "no_flush_wait"
)


def _append_event(*, wait_for_flush: bool) -> Insert:
    appended = select(
        bindparam("b_thread", type_=events.c.thread_id.type),
        _bumped.c.event_seq,
        bindparam("b_run", type_=events.c.run_id.type),
        bindparam("b_type", type_=events.c.type.type),
        bindparam("b_payload", type_=events.c.payload.type),
        bindparam("b_now", type_=events.c.created_at.type),
    )
    if not wait_for_flush:
        appended = appended.select_from(_bumped.join(_no_flush_wait, _no_flush_wait.c.setting.is_not(None)))
    return (
        insert(events)
        .from_select(["thread_id", "seq", "run_id", "type", "payload", "created_at"], appended)
        .returning(events.c.seq)
    )


APPEND_EVENT_PG = _append_event(wait_for_flush=True)
#: The same, returning before its WAL reaches disk: an event no other write depends on
#: (``tool_call_started``), whose loss to a crash of PostgreSQL leaves the log one event shorter.
APPEND_EVENT_NO_FLUSH_WAIT_PG = _append_event(wait_for_flush=False)

SETTLE_CALL = (
    update(tool_calls)
    .where(tool_calls.c.effect_key == bindparam("b_key"))
    .values(
        status=bindparam("b_status", type_=tool_calls.c.status.type),
        result=bindparam("b_result", type_=tool_calls.c.result.type),
        is_error=bindparam("b_is_error", type_=tool_calls.c.is_error.type),
        lease_owner=None,
        lease_expires_at=None,
        finished_at=bindparam("b_now", type_=tool_calls.c.finished_at.type),
    )
)

DELETE_OUTBOX = delete(outbox).where(outbox.c.key == bindparam("b_key"))

GET_RUN = select(runs).where(runs.c.id == bindparam("b_id"))
#: The run's row, locked (interventions, deliveries, the SQLite step claim).
GET_RUN_LOCKED = GET_RUN.with_for_update()

INSERT_TOOL_CALLS = insert(tool_calls)

_OUTBOX_COLUMNS = ("key", "task", "args", "queue", "argsrepr", "created_at", "due_at", "publish_count")
_INSERT_OUTBOX: dict[str, Insert] = {}


def insert_outbox(dialect: str) -> Insert:
    """An outbox row, or nothing if its key is pending already (one statement per dialect)."""
    statement = _INSERT_OUTBOX.get(dialect)
    if statement is None:
        values = {name: bindparam(f"b_{name}", type_=outbox.c[name].type) for name in _OUTBOX_COLUMNS}
        if dialect == "postgresql":
            statement = pg_insert(outbox).values(**values).on_conflict_do_nothing(index_elements=["key"])
        else:
            statement = sqlite_insert(outbox).values(**values).on_conflict_do_nothing(index_elements=["key"])
        _INSERT_OUTBOX[dialect] = statement
    return statement


def insert_agent(dialect: str) -> Insert:
    """An agent's row, or its definition written over the row that a process starting at the same
    time inserted first (a worker, Beat and the API start together)."""
    values = {name: bindparam(f"b_{name}", type_=agents.c[name].type) for name in _AGENT_COLUMNS}
    statement = (pg_insert if dialect == "postgresql" else sqlite_insert)(agents).values(**values)
    return statement.on_conflict_do_update(
        index_elements=["name"],
        set_={name: statement.excluded[name] for name in _AGENT_COLUMNS if name != "name"},
    )


_AGENT_COLUMNS = ("name", "config_hash", "description", "updated_at")

CLAIM_RUN = (
    update(runs)
    .where(runs.c.id == bindparam("b_id"), runs.c.fence == bindparam("b_fence"))
    .values(
        fence=runs.c.fence + 1,
        status="running",
        lease_owner=bindparam("b_owner", type_=runs.c.lease_owner.type),
        lease_expires_at=bindparam("b_until", type_=runs.c.lease_expires_at.type),
        started_at=func.coalesce(runs.c.started_at, bindparam("b_now", type_=runs.c.started_at.type)),
        updated_at=bindparam("b_now2", type_=runs.c.updated_at.type),
    )
    .returning(runs.c.fence)
)

CLAIM_CALL = (
    update(tool_calls)
    .where(tool_calls.c.effect_key == bindparam("b_key"))
    .values(
        status="started",
        attempt=tool_calls.c.attempt + 1,
        first_started_at=func.coalesce(
            tool_calls.c.first_started_at, bindparam("b_now", type_=tool_calls.c.first_started_at.type)
        ),
        lease_owner=bindparam("b_owner", type_=tool_calls.c.lease_owner.type),
        lease_expires_at=bindparam("b_until", type_=tool_calls.c.lease_expires_at.type),
    )
)

_ADVANCE: dict[tuple[str, ...], Update] = {}


def advance_run(columns: tuple[str, ...]) -> Update:
    """The fenced transition that sets ``columns`` (one statement per set of columns)."""
    statement = _ADVANCE.get(columns)
    if statement is None:
        statement = _ADVANCE[columns] = (
            update(runs)
            .where(runs.c.id == bindparam("b_id"), runs.c.fence == bindparam("b_fence"))
            .values(
                fence=runs.c.fence + 1,
                updated_at=bindparam("b_now", type_=runs.c.updated_at.type),
                **{name: bindparam(f"v_{name}", type_=runs.c[name].type) for name in columns},
            )
            .returning(runs.c.fence, runs.c.thread_id)
        )
    return statement


#: The CTE ``u`` of a step's one-statement reply commit: the step's model usage, only if the
#: fenced run update ``r`` matched.
_STEP_USAGE = """), u AS (
    INSERT INTO model_usage (run_id, step, thread_id, agent, model, requests, input_tokens, output_tokens,
        cost, created_at)
    SELECT CAST(:run_id AS varchar), :step, CAST(:thread_id AS varchar), CAST(:agent AS varchar),
        CAST(:model AS varchar), CAST(:requests AS integer), :input_tokens, :output_tokens,
        CAST(:cost AS double precision), :now
    FROM r
), """


def _message_and_its_event(
    role: str, text_param: str, *, then_run_event: bool = False, started_events: bool = False
) -> str:
    """The CTEs ``m``, ``t`` and ``e`` of a one-statement commit: a message of ``role`` (its text
    the parameter ``text_param``, its parts ``:parts``) at the thread's next number, and its
    ``message`` event (its role, text and parts, and its number: built here from the message's
    own parameters, so a long text goes over the wire once) at the thread's next event number;
    each only if the fenced run update ``r`` matched. With ``then_run_event``, the run's ``run``
    event (``:run_payload``) follows at the number after. With ``started_events``, the
    ``tool_call_started`` events of ``:started`` (a JSON array of ``:started_count`` payloads)
    come first, at the numbers before the message's event."""
    bump = 2 if then_run_event else 1
    started_count = " + CAST(:started_count AS integer)" if started_events else ""
    started = (
        f"""
    SELECT CAST(:thread_id AS varchar), t.event_seq - {bump} - CAST(:started_count AS integer) + s.ord,
        CAST(:run_id AS varchar), 'tool_call_started', s.payload, :now
    FROM t, json_array_elements(CAST(:started AS json)) WITH ORDINALITY AS s(payload, ord)
    UNION ALL"""
        if started_events
        else ""
    )
    run_event = (
        """
    UNION ALL
    SELECT CAST(:thread_id AS varchar), t.event_seq, CAST(:run_id AS varchar), 'run', CAST(:run_payload AS json),
        :now
    FROM t"""
        if then_run_event
        else ""
    )
    return f"""m AS (
    INSERT INTO messages (thread_id, seq, run_id, role, text, parts, created_at)
    SELECT CAST(:thread_id AS varchar),
        (SELECT coalesce(max(seq), -1) + 1 FROM messages WHERE thread_id = CAST(:thread_id AS varchar)),
        CAST(:run_id AS varchar), '{role}', CAST(:{text_param} AS text), CAST(:parts AS json), :now
    FROM r
    RETURNING seq
), t AS (
    UPDATE threads SET event_seq = event_seq + {bump}{started_count}
    WHERE id = CAST(:thread_id AS varchar) AND EXISTS (SELECT 1 FROM r)
    RETURNING event_seq
), e AS (
    INSERT INTO events (thread_id, seq, run_id, type, payload, created_at){started}
    SELECT CAST(:thread_id AS varchar), t.event_seq - {bump - 1}, CAST(:run_id AS varchar), 'message',
        CAST(jsonb_build_object('role', '{role}', 'text', CAST(:{text_param} AS text))
            || coalesce(CAST(:parts AS jsonb), '{{}}'::jsonb) || jsonb_build_object('seq', m.seq) AS json), :now
    FROM t, m{run_event}
)"""


#: PostgreSQL: a tool call's whole result commit in one statement (so one round trip, in
#: autocommit). Each data-modifying part runs only if the fenced run update matched, so a stale
#: fence writes nothing; the message takes the thread's next number and its event the next
#: event number, as the separate statements would. The next task's outbox row is written only
#: with ``:has_next`` (a call that ends the turn leaves what follows to the run's finish).
def _commit_call_result(*, wait_for_flush: bool) -> TextClause:
    sql = (
        """
WITH r AS (
    UPDATE runs SET fence = fence + 1, updated_at = :now, lease_owner = NULL, lease_expires_at = NULL
    WHERE id = CAST(:run_id AS varchar) AND fence = :fence
    RETURNING fence
), c AS (
    UPDATE tool_calls SET status = :status, result = CAST(:content AS text), is_error = :is_error,
        lease_owner = NULL, lease_expires_at = NULL, finished_at = :now
    WHERE effect_key = CAST(:effect_key AS varchar) AND EXISTS (SELECT 1 FROM r)
), """
        + _message_and_its_event("tool", "content")
        + """, d AS (
    DELETE FROM outbox WHERE key = CAST(:effect_key AS varchar) AND :own_outbox AND EXISTS (SELECT 1 FROM r)
), o AS (
    INSERT INTO outbox (key, task, args, queue, argsrepr, created_at, due_at, publish_count)
    SELECT CAST(:next_key AS varchar), CAST(:next_task AS varchar), CAST(:next_args AS json),
        CAST(:next_queue AS varchar), CAST(:next_argsrepr AS varchar), :now, :next_due, 0
    FROM r
    WHERE :has_next
    ON CONFLICT (key) DO NOTHING
)
SELECT fence FROM r
"""
    )
    return text(sql if wait_for_flush else _without_flush_wait(sql)).bindparams(
        bindparam("now", type_=UTCDateTime()),
        bindparam("next_due", type_=UTCDateTime()),
        bindparam("is_error", type_=Boolean()),
        bindparam("own_outbox", type_=Boolean()),
        bindparam("has_next", type_=Boolean()),
    )


COMMIT_CALL_RESULT_PG = _commit_call_result(wait_for_flush=True)
#: The same, returning before its WAL reaches disk: a read_only call's result (see _NO_FLUSH_WAIT).
COMMIT_CALL_RESULT_NO_FLUSH_WAIT_PG = _commit_call_result(wait_for_flush=False)


#: PostgreSQL: a tool call's claim (the run's lease and fence, the call started, its outbox row
#: consumed) as one statement, in autocommit: what CLAIM_RUN, CLAIM_CALL and DELETE_OUTBOX do in
#: one transaction, in one round trip. The call and the outbox row change only if the fenced run
#: update matched; the new fence comes back, or no row.
CLAIM_CALL_PG = text(
    """
WITH r AS (
    UPDATE runs SET fence = fence + 1, status = 'running', lease_owner = CAST(:owner AS varchar),
        lease_expires_at = :until, started_at = coalesce(started_at, :now), updated_at = :now
    WHERE id = CAST(:run_id AS varchar) AND fence = :fence
    RETURNING fence
), c AS (
    UPDATE tool_calls SET status = 'started', attempt = attempt + 1,
        first_started_at = coalesce(first_started_at, :now),
        lease_owner = CAST(:owner AS varchar), lease_expires_at = :until
    WHERE effect_key = CAST(:effect_key AS varchar) AND EXISTS (SELECT 1 FROM r)
), d AS (
    DELETE FROM outbox WHERE key = CAST(:effect_key AS varchar) AND EXISTS (SELECT 1 FROM r)
)
SELECT fence FROM r
"""
).bindparams(bindparam("now", type_=UTCDateTime()), bindparam("until", type_=UTCDateTime()))

#: A step's claim counts the attempt it takes over from (a lease still named on the run: its
#: worker died or stalled holding the step, see ``Run.voided_after_claim``) as a
#: voided one of ``:step``, which the step's usage will count. Read before the update: the row's old values.
_COUNT_VOIDED = """voided_requests = CASE WHEN runs.lease_owner IS NULL THEN runs.voided_requests
            WHEN runs.voided_step = :step THEN runs.voided_requests + 1 ELSE 1 END,
        voided_step = CASE WHEN runs.lease_owner IS NULL THEN runs.voided_step ELSE :step END"""

#: PostgreSQL: a model step's claim (the run's lease and fence, the step's outbox row consumed,
#: and for a run that was queued its "running" event) as one statement, in autocommit. The run
#: changes only if its fence still holds and no other worker's lease is live (``lease_held``);
#: the rest only if it did. The new fence comes back, or no row.
CLAIM_STEP_PG = text(
    """
WITH r AS (
    UPDATE runs SET fence = fence + 1, status = 'running', lease_owner = CAST(:owner AS varchar),
        lease_expires_at = :until, started_at = coalesce(started_at, :now), updated_at = :now,
        """
    + _COUNT_VOIDED
    + """
    WHERE id = CAST(:run_id AS varchar) AND fence = :fence
        AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= :now)
    RETURNING fence
), d AS (
    DELETE FROM outbox WHERE key = CAST(:step_key AS varchar) AND EXISTS (SELECT 1 FROM r)
), s AS (
    UPDATE threads SET event_seq = event_seq + 1
    WHERE id = CAST(:thread_id AS varchar) AND :was_queued AND EXISTS (SELECT 1 FROM r)
    RETURNING event_seq
), e AS (
    INSERT INTO events (thread_id, seq, run_id, type, payload, created_at)
    SELECT CAST(:thread_id AS varchar), s.event_seq, CAST(:run_id AS varchar), 'run', :payload, :now FROM s
)
SELECT fence FROM r
"""
).bindparams(
    bindparam("now", type_=UTCDateTime()),
    bindparam("until", type_=UTCDateTime()),
    bindparam("payload", type_=events.c.payload.type),
    bindparam("was_queued", type_=Boolean()),
)

#: PostgreSQL: a model step's reply that asks for tool calls, committed as one statement in
#: autocommit: the run moved to its next step (fenced, its lease released), the step's usage,
#: the ``tool_call_started`` events the step held (``:started``), the assistant message and its
#: event, one ledger row per call (``:calls``, a JSON array) and
#: the outbox rows of what runs first (``:entries``, a JSON array of tool tasks). Each part
#: runs only if the fenced run update matched; the new fence comes back, or no row.
COMMIT_REPLY_PG = text(
    """
WITH r AS (
    UPDATE runs SET fence = fence + 1, updated_at = :now, step = :next_step,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE id = CAST(:run_id AS varchar) AND fence = :fence
    RETURNING fence
"""
    + _STEP_USAGE
    + _message_and_its_event("assistant", "text", started_events=True)
    + """, c AS (
    INSERT INTO tool_calls (effect_key, run_id, thread_id, step, idx, calls_in_step, call_id, tool, args,
        args_hash, effect, dedup_window_ms, finality, queue, status, attempt, is_error, created_at, batch)
    SELECT x.effect_key, CAST(:run_id AS varchar), CAST(:thread_id AS varchar), :step, x.idx, :calls_in_step,
        x.call_id, x.tool, x.args, x.args_hash, x.effect, x.dedup_window_ms, x.finality, x.queue,
        'pending', 0, false, :now, x.batch
    FROM r, json_to_recordset(CAST(:calls AS json)) AS x(effect_key varchar, idx integer, call_id varchar,
        tool varchar, args text, args_hash varchar, effect varchar, dedup_window_ms bigint, finality varchar,
        queue varchar, batch integer)
), o AS (
    INSERT INTO outbox (key, task, args, queue, argsrepr, created_at, due_at, publish_count)
    SELECT y.key, y.task, y.args, y.queue, y.argsrepr, :now, :due, 0
    FROM r, json_to_recordset(CAST(:entries AS json)) AS y(key varchar, task varchar, args json, queue varchar,
        argsrepr varchar)
    ON CONFLICT (key) DO NOTHING
)
SELECT fence FROM r
"""
).bindparams(
    bindparam("now", type_=UTCDateTime()),
    bindparam("due", type_=UTCDateTime()),
)

#: PostgreSQL: a model step's reply that ends its run (no tool calls; not an agent tool's
#: child), in one statement: the run moved to its next step and completed with the reply as its
#: output (fenced, its lease released, its fence moved by two as the step's commit and the finish
#: move it), the step's usage, the assistant message and its event, and the run's ``completed``
#: event after it. Run inside the transaction that then hands the thread on
#: (``transitions.runs.finished``): the run's row is locked by the update here, then the thread's
#: by its event number, in the lock order of every transition. Each part runs only if the fenced
#: run update matched; the new fence comes back, or no row.
COMMIT_LAST_REPLY_PG = text(
    """
WITH r AS (
    UPDATE runs SET fence = fence + 2, updated_at = :now, step = :next_step, status = 'completed',
        output = CAST(:text AS text), finished_at = :now, lease_owner = NULL, lease_expires_at = NULL
    WHERE id = CAST(:run_id AS varchar) AND fence = :fence
    RETURNING fence
"""
    + _STEP_USAGE
    + _message_and_its_event("assistant", "text", then_run_event=True)
    + """
SELECT fence FROM r
"""
).bindparams(bindparam("now", type_=UTCDateTime()))

#: PostgreSQL: a run started on a new thread, as one statement in autocommit: the thread (held
#: by the run from the start, its event numbers 1 and 2 taken), the run (queued, step 0), the
#: run's ``run`` event, the user's message (number 0) and its ``message`` event, and the outbox
#: row of the first step on the queue the agent's workers recorded. What ``submit_run`` and
#: ``activate`` write in a transaction, in one round trip. Nothing is written unless the agent is
#: registered; its recorded config hash and queue come back, or no row.
START_RUN_PG = text(
    """
WITH a AS (
    SELECT config_hash, CASE WHEN json_typeof(description -> 'queue') = 'string'
        THEN description ->> 'queue' END AS queue
    FROM agents WHERE name = CAST(:agent AS varchar)
), th AS (
    INSERT INTO threads (id, agent, config_hash, parent_thread_id, active_run_id, event_seq, created_at, tenant)
    SELECT CAST(:thread_id AS varchar), CAST(:agent AS varchar),
        coalesce(CAST(:config_hash AS varchar), a.config_hash), NULL, CAST(:run_id AS varchar), 2, :now,
        CAST(:tenant AS varchar)
    FROM a
    RETURNING id
), r AS (
    INSERT INTO runs (id, thread_id, agent, status, input, input_meta, agent_tool_run_id, step, fence, created_at,
        updated_at, traceparent)
    SELECT CAST(:run_id AS varchar), th.id, CAST(:agent AS varchar), 'queued', CAST(:input AS varchar), NULL, NULL,
        0, 0, :now, :now, CAST(:traceparent AS varchar)
    FROM th
    RETURNING id
), m AS (
    INSERT INTO messages (thread_id, seq, run_id, role, text, parts, meta, key, created_at)
    SELECT CAST(:thread_id AS varchar), 0, r.id, 'user', CAST(:input AS text), NULL, NULL, NULL, :now FROM r
), e AS (
    INSERT INTO events (thread_id, seq, run_id, type, payload, created_at)
    SELECT CAST(:thread_id AS varchar), 1, r.id, 'run', CAST(:run_payload AS json), :now FROM r
    UNION ALL
    SELECT CAST(:thread_id AS varchar), 2, r.id, 'message',
        CAST(jsonb_build_object('seq', 0, 'role', 'user', 'text', CAST(:input AS text)) AS json), :now FROM r
), o AS (
    INSERT INTO outbox (key, task, args, queue, argsrepr, created_at, due_at, publish_count)
    SELECT CAST(:step_key AS varchar), CAST(:step_task AS varchar), CAST(:step_args AS json), a.queue,
        CAST(:step_argsrepr AS varchar), :now, :due, 0
    FROM r, a
)
SELECT a.config_hash, a.queue FROM a, r
"""
).bindparams(bindparam("now", type_=UTCDateTime()), bindparam("due", type_=UTCDateTime()))

_RUN_COLUMNS = tuple(c.name for c in runs.c)
#: What a worker's hot path leaves out of a run it reads: its input, output and error, which
#: neither a tool call nor a model step reads, and which grow with the prompt and the answer (a
#: long prompt would otherwise be read again by every task of its run). Read as "" and NULL.
RUN_TEXT_COLUMNS = ("input", "output", "error")
#: RUN_TEXT_COLUMNS as a step's claim returns them.
_RUN_TEXT_AS_READ = {
    name: "CAST('' AS text) AS input" if name == "input" else f"NULL AS {name}" for name in RUN_TEXT_COLUMNS
}


#: PostgreSQL: a model step's read and claim as one statement, in autocommit, for a delivery of
#: the step that is due: the run is at ``:step``, queued or running, no other worker's lease is
#: live (what ``decide_step`` calls Proceed), and no call of the step before waits to run or is
#: running (what ``Store.unsettled_call`` asks: a step published by a result that a crash of
#: PostgreSQL took back finds one). Then what CLAIM_STEP_PG writes: the run's lease
#: and next fence, the step's outbox row consumed and, for a run that was queued, its ``running``
#: event. The run as it was before the claim comes back (its new fence is one more), or no row,
#: with nothing written: then the run is read and decided apart, to say why.
#:
#: With the run comes its thread's history, as the step's history cache asks for it (the column
#: ``history``, a JSON array of message rows in order): the messages ``:first_seq`` and from
#: ``:last_seq`` on, the ends of the cached copy and what was appended after it (MESSAGE_ENDS),
#: or, with ``-1`` and ``0``, the whole thread (THREAD_MESSAGES). The claim writes no message,
#: so the history is the thread as the statement found it. Each row comes with its version (its
#: ``xmin``: the transaction that wrote it, which a rewrite or a replacement changes); an end whose
#: version is still the one the cache holds (``:first_version``, ``:last_version``) comes back as
#: ``{"seq": n, "unchanged": true}`` only, so a long first prompt or tool result is not read
#: again by every step.
def _read_and_claim_step(*, wait_for_flush: bool) -> TextualSelect:
    sql = (
        """
WITH old AS (
    SELECT * FROM runs
    WHERE id = CAST(:run_id AS varchar) AND step = :step AND status IN ('queued', 'running')
        AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= :now)
        AND NOT EXISTS (
            SELECT 1 FROM tool_calls
            WHERE run_id = CAST(:run_id AS varchar) AND step = :step - 1 AND status IN ('pending', 'started')
        )
    FOR UPDATE
), r AS (
    UPDATE runs SET fence = runs.fence + 1, status = 'running', lease_owner = CAST(:owner AS varchar),
        lease_expires_at = :until, started_at = coalesce(runs.started_at, :now), updated_at = :now,
        """
        + _COUNT_VOIDED
        + """
    FROM old WHERE runs.id = old.id
    RETURNING """
        + ", ".join(_RUN_TEXT_AS_READ.get(name, f"old.{name}") for name in _RUN_COLUMNS)
        + """
), d AS (
    DELETE FROM outbox WHERE key = CAST(:step_key AS varchar) AND EXISTS (SELECT 1 FROM r)
), s AS (
    UPDATE threads SET event_seq = event_seq + 1
    WHERE id = (SELECT thread_id FROM r) AND (SELECT status FROM r) = 'queued'
    RETURNING id, event_seq
), e AS (
    INSERT INTO events (thread_id, seq, run_id, type, payload, created_at)
    SELECT s.id, s.event_seq, CAST(:run_id AS varchar), 'run', :payload, :now FROM s
)
SELECT r.*, (
    SELECT json_agg(CASE
        WHEN ((m.seq = CAST(:first_seq AS integer) AND m.xmin::text = CAST(:first_version AS text))
            OR (m.seq = CAST(:last_seq AS integer) AND m.xmin::text = CAST(:last_version AS text))) IS TRUE
        THEN json_build_object('seq', m.seq, 'unchanged', true)
        ELSE json_build_object('thread_id', m.thread_id, 'seq', m.seq, 'run_id', m.run_id, 'role', m.role,
            'text', m.text, 'parts', m.parts, 'meta', m.meta, 'key', m.key, 'created_at', m.created_at,
            'row_version', m.xmin::text)
        END ORDER BY m.seq)
    FROM messages m
    WHERE m.thread_id = r.thread_id AND (m.seq = CAST(:first_seq AS integer) OR m.seq >= CAST(:last_seq AS integer))
        AND m.superseded_by IS NULL
) AS history
FROM r
"""
    )
    return (
        text(sql if wait_for_flush else _without_flush_wait(sql))
        .bindparams(
            bindparam("now", type_=UTCDateTime()),
            bindparam("until", type_=UTCDateTime()),
            bindparam("payload", type_=events.c.payload.type),
        )
        .columns(*runs.c, column("history", messages.c.parts.type))
    )


READ_AND_CLAIM_STEP_PG = _read_and_claim_step(wait_for_flush=True)
#: The same, returning before its WAL reaches disk: a claim whose loss to a crash of PostgreSQL
#: lets the step run again, as after a worker's death (see _NO_FLUSH_WAIT).
READ_AND_CLAIM_STEP_NO_FLUSH_WAIT_PG = _read_and_claim_step(wait_for_flush=False)
