"""Run lifecycle transitions shared by the client and the workers.

A thread is driven by one run at a time (``threads.active_run_id``). A run that arrives while
another is active waits as ``queued``; its user message joins the thread only when it becomes
active, so messages are queued and never interleaved. Each function here is one piece of a
transaction: it takes a :class:`~threads_celery.store.Tx` and returns the outbox entries the
caller publishes after commit.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from threads_celery.decisions.next_step import FinishRun, NextStep, after_call
from threads_celery.exceptions import ConfigError, FenceLost, RunNotFound, ThreadNotFound
from threads_celery.records import DEFAULT_TENANT, TERMINAL_STATUSES, CallRow, OutboxEntry, Run, ToolResult
from threads_celery.store import Store, Tx
from threads_celery.telemetry import metrics, tracing
from threads_celery.transitions import branches, finish_callbacks
from threads_celery.transitions.agent_tools import child_finished, child_signal, deliver_entry

STEP_TASK = "threads.step"
TOOL_TASK = "threads.tool"


#: The order in which every transaction takes row locks, so two never wait on each other:
#: a run, then its thread, then the agent-tool row it serves (if it is a child), then the
#: parent's run and thread, and so on up; a child's rows always before its parent's. A lock taken
#: out of this order must never wait (SKIP LOCKED).
LOCK_ORDER = ("runs", "threads", "agent_tool_runs", "the parent's runs", "the parent's threads")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """A fresh, sortable-enough id such as ``run_3f2a...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def step_key(run_id: str, step: int) -> str:
    """The outbox key and Celery task id of a model step."""
    return f"step:{run_id}:{step}"


def effect_key_for(run_id: str, step: int, index: int) -> str:
    """The effect key of a tool call: stable across every retry of the same call."""
    return f"{run_id}:{step}:{index}"


def step_entry(run: Run | str, step: int, agent: str, queue: str | None = None) -> OutboxEntry:
    """The outbox entry of a model step, on the agent's own queue if it names one."""
    run_id = run if isinstance(run, str) else run.id
    return OutboxEntry(
        key=step_key(run_id, step),
        task=STEP_TASK,
        args=(run_id, step),
        queue=queue,
        argsrepr=f"({agent!r} step {step}, run {run_id})",
    )


def agent_queue(tx: Tx, agent: str) -> str | None:
    """The queue an agent's steps take, as its workers recorded it (None: the default queue).

    Read from the store, not from the process's agents: a web app may start a run by name
    without importing the agent.
    """
    queue = (tx.agent_description(agent) or {}).get("queue")
    return queue if isinstance(queue, str) else None


def tool_entry(effect_key: str, tool: str, queue: str | None) -> OutboxEntry:
    return OutboxEntry(
        key=effect_key,
        task=TOOL_TASK,
        args=(effect_key,),
        queue=queue,
        argsrepr=f"({tool!r}, {effect_key})",
    )


def submit_run(
    tx: Tx,
    *,
    agent: str,
    config_hash: str,
    message: str,
    now: datetime,
    thread_id: str | None = None,
    run_id: str | None = None,
    parent_thread_id: str | None = None,
    agent_tool_run_id: str | None = None,
    input_meta: dict[str, Any] | None = None,
    tenant: str | None = None,
) -> tuple[Run, list[OutboxEntry]]:
    """Record a new run on a (new or existing) thread; activate it if the thread is idle.

    Idempotent by ``run_id``: a run that exists is returned as it is, with nothing to publish.
    ``input_meta`` travels with the user message (``key`` makes the message itself unique).
    With ``tenant``, a new thread belongs to it, and an existing thread or run of another tenant
    is ``ThreadNotFound``/``RunNotFound``, with nothing written.
    """
    if run_id is not None:
        existing = tx.get_run(run_id)
        if existing is not None:
            if tenant is not None and tx.thread_tenant(existing.thread_id) != tenant:
                raise RunNotFound(run_id)
            return existing, []
    run_id = run_id or new_id("run")
    if thread_id is None:
        thread_id = new_id("thread")
        tx.insert_thread(thread_id, agent, config_hash, now, parent_thread_id=parent_thread_id, tenant=tenant)
    else:
        thread = tx.get_thread(thread_id, lock=True)
        if thread is None:
            tx.insert_thread(thread_id, agent, config_hash, now, parent_thread_id=parent_thread_id, tenant=tenant)
        elif tenant is not None and thread.tenant != tenant:
            raise ThreadNotFound(thread_id)
        else:
            if thread.agent != agent:
                raise ConfigError(f"thread {thread_id!r} belongs to agent {thread.agent!r}, not {agent!r}")
            if thread.config_hash != config_hash:
                raise ConfigError(
                    f"agent {agent!r} changed since thread {thread_id!r} began; a config change starts a new thread"
                )
            if thread.branch is not None:
                # A run on a branch asks before repeating what the history left behind did.
                prior = branches.prior_effects_meta(tx, thread)
                if prior:
                    input_meta = {**(input_meta or {}), branches.PRIOR_EFFECTS_KEY: prior}
    # The run's span, under whatever is current (a request, a parent's tool call): its context
    # is stored, so every task of the run joins the same trace (threads_celery.telemetry.tracing).
    traceparent = tracing.start_run_span(run_id, thread_id, agent, parent_run_id=agent_tool_run_id)
    tx.insert_run(
        run_id,
        thread_id,
        agent,
        message,
        now,
        agent_tool_run_id=agent_tool_run_id,
        input_meta=input_meta,
        traceparent=traceparent,
    )
    run = tx.get_run(run_id)
    assert run is not None
    entries: list[OutboxEntry] = []
    if tx.set_active_run(thread_id, run_id, expected=None):
        entries.append(activate(tx, run, now))
    return run, entries


def start_on_new_thread(
    store: Store, *, agent: str, config_hash: str | None, message: str, tenant: str | None, now: datetime
) -> tuple[str, str, list[OutboxEntry]] | None:
    """What :func:`submit_run` and :func:`activate` write for a run on a new thread, as one
    statement (PostgreSQL: ``store.starts_in_one_statement``): ``(run_id, thread_id, entries)``,
    or None (nothing written) when the agent is not registered. ``config_hash`` None takes the
    agent's recorded one."""
    run_id, thread_id = new_id("run"), new_id("thread")
    traceparent = tracing.start_run_span(run_id, thread_id, agent, parent_run_id=None)
    started = store.start_run_on_new_thread(
        agent=agent,
        config_hash=config_hash,
        message=message,
        thread_id=thread_id,
        run_id=run_id,
        tenant=tenant or DEFAULT_TENANT,
        traceparent=traceparent,
        step_entry=step_entry(run_id, 0, agent),
        now=now,
    )
    if started is None:
        return None
    return run_id, thread_id, [step_entry(run_id, 0, agent, started[1])]


def activate(tx: Tx, run: Run, now: datetime) -> OutboxEntry:
    """The run now drives its thread: its message joins the history and its first step is due."""
    meta = dict(run.input_meta or {})
    key = meta.pop("key", None)
    narrate = bool(meta.pop("narrate", False))
    meta.pop(finish_callbacks.META_KEY, None)  # the run's, not the message's
    tx.insert_message(
        thread_id=run.thread_id,
        run_id=run.id,
        role="assistant" if narrate else "user",
        text=run.input,
        now=now,
        meta=meta or None,
        key=key,
    )
    entry = step_entry(run, 0, run.agent, agent_queue(tx, run.agent))
    tx.insert_outbox(entry, now)
    return entry


#: The model name a run's usage row has for the voided attempts of a step that never committed.
VOIDED_MODEL = "(voided attempts)"


def finish(
    tx: Tx,
    run: Run,
    *,
    fence: int,
    status: str,
    now: datetime,
    output: str | None = None,
    error: str | None = None,
) -> list[OutboxEntry]:
    """End the run (fenced) and hand the thread to the next queued run, if any."""
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status!r} is not a terminal status")
    # The run, then the thread (LOCK_ORDER); the thread before the release: a start racing it
    # must either see the thread idle or be seen here as queued, never neither.
    current = tx.get_run(run.id, lock=True)
    tx.get_thread(run.thread_id, lock=True)
    voided = current.voided(current.step) if current is not None else 0
    if current is not None and voided and not tx.has_usage(run.id, current.step):
        # Attempts of the step the run ends in that may have been billed, and no attempt that
        # committed to count them with: their requests (their tokens are not known).
        tx.record_usage(
            run_id=run.id, step=current.step, thread_id=run.thread_id, agent=run.agent, model=VOIDED_MODEL,
            input_tokens=0, output_tokens=0, cost=None, now=now, requests=voided,
        )  # fmt: skip
    moved = tx.advance_run(
        run.id,
        fence=fence,
        now=now,
        status=status,
        output=output,
        error=error,
        finished_at=now,
        lease_owner=None,
        lease_expires_at=None,
    )
    if moved is None:
        raise FenceLost(run.id, fence)
    return finished(tx, run, status=status, now=now, output=output, error=error)


def finished(
    tx: Tx, run: Run, *, status: str, now: datetime, output: str | None = None, error: str | None = None
) -> list[OutboxEntry]:
    """What follows the end of ``run``, whose ``status`` ``tx`` has just written (locking the run,
    then the thread): the thread handed to the next queued run, if any, and for an agent tool's
    child, its parent told."""
    metrics.run_finished(status)
    entries = release_thread(tx, run, now)
    if run.agent_tool_run_id is not None:
        entries += child_finished(tx, run, status=status, output=output, error=error, now=now)
    entries += finish_callback(tx, run, status, now)
    return entries


def finish_callback(tx: Tx, run: Run, status: str, now: datetime) -> list[OutboxEntry]:
    """The intent to send the signature ``run`` was started with (``on_finish``), if any:
    ``threads.deliver`` sends it (see :mod:`.finish_callbacks`)."""
    if finish_callbacks.spec_of(run) is None:
        return []
    entry = deliver_entry(run.id, status)
    tx.insert_outbox(entry, now)
    return [entry]


def release_thread(tx: Tx, run: Run, now: datetime) -> list[OutboxEntry]:
    """Pass the thread from ``run`` to the oldest queued run behind it."""
    following = tx.next_queued_run(run.thread_id, after=run.id)
    if following is None:
        tx.set_active_run(run.thread_id, None, expected=run.id)
        return []
    if not tx.set_active_run(run.thread_id, following.id, expected=run.id):
        return []
    return [activate(tx, following, now)]


def cancel(tx: Tx, run_id: str, *, now: datetime, reason: str = "cancelled") -> tuple[Run, list[OutboxEntry]]:
    """Abort a run that has not ended; a no-op for one that has."""
    run = tx.get_run(run_id, lock=True)
    if run is None:
        raise RunNotFound(run_id)
    if run.is_terminal:
        return run, []
    thread = tx.get_thread(run.thread_id, lock=True)
    if thread is None:
        raise ThreadNotFound(run.thread_id)
    tx.advance_run(
        run.id,
        fence=run.fence,
        now=now,
        status="aborted",
        error=reason,
        finished_at=now,
        lease_owner=None,
        lease_expires_at=None,
    )
    _settle_waiting_calls(tx, run, reason, now)
    entries: list[OutboxEntry] = []
    if thread.active_run_id == run.id:
        entries = release_thread(tx, run, now)
    if run.agent_tool_run_id is not None:
        entries += child_finished(tx, run, status="aborted", output=None, error=reason, now=now)
    entries += finish_callback(tx, run, "aborted", now)
    ended = tx.get_run(run_id)
    assert ended is not None
    return ended, entries


#: The calls a cancel settles: each waits for a person. (A pending call may be running already,
#: as a concurrent read_only call records no claim; its own task settles it.)
WAITING_CALL_STATUSES = ("awaiting_approval", "awaiting_variable", "parked")


def _settle_waiting_calls(tx: Tx, run: Run, reason: str, now: datetime) -> None:
    """Settle a cancelled run's waiting calls: they leave ``parked()``, and the thread keeps a
    result for every call (a later run's model sees why), each announced on the event stream."""
    if run.step == 0:
        return
    for call in tx.calls_in_step(run.id, run.step - 1):
        if call.status not in WAITING_CALL_STATUSES:
            continue
        if call.status == "parked":
            status, text = (
                "error",
                f"not settled: the run was cancelled ({reason}); the call was interrupted and may have taken effect",
            )
        else:
            status, text = "skipped", f"not run: the run was cancelled ({reason})"
        tx.settle_call(call.effect_key, status=status, result=text, is_error=True, now=now)
        tx.insert_message(
            thread_id=run.thread_id,
            run_id=run.id,
            role="tool",
            text=text,
            now=now,
            tool_result=ToolResult(call_id=call.call_id, name=call.tool, content=text, is_error=True),
        )
        tx.delete_outbox(call.effect_key)
        payload = {
            "run_id": run.id,
            "effect_key": call.effect_key,
            "name": call.tool,
            "was": call.status,
            "status": status,
            "reason": text,
        }
        tx.append_event(run.thread_id, run.id, "tool_call_cancelled", payload, now)


def commit_call_result(
    store: Store,
    run: Run,
    call: CallRow,
    *,
    fence: int,
    content: str,
    is_error: bool,
    ends_turn: bool,
    own_outbox: bool,
    step_queue: str | None,
    now: datetime,
    fails_run: str | None = None,
    kind: str | None = None,
    gives_output: bool = False,
) -> tuple[str, list[OutboxEntry]]:
    """A worker's result commit of a call, in a transaction of its own (fenced).

    Writes what :func:`record_call_result` writes. When nothing else has to join the result's
    transaction it is the store's one operation (on PostgreSQL one statement, one round trip):
    the call does not end the turn (which finishes the run), the run is not a child (whose
    parent hears of each result) and the call after it in the reply is known. ``step_queue``
    is the agent's step queue as this worker knows it (so the hot path reads nothing first).
    """
    following = None if fails_run else _known_next_entry(run, call, step_queue, ends_run=ends_turn and not is_error)
    if following is None or run.agent_tool_run_id is not None:
        with store.transaction() as tx:
            return record_call_result(
                tx,
                run,
                call,
                fence=fence,
                content=content,
                is_error=is_error,
                ends_turn=ends_turn,
                now=now,
                own_outbox=own_outbox,
                fails_run=fails_run,
                kind=kind,
                gives_output=gives_output,
            )
    moved = store.commit_call_result(
        run_id=run.id,
        thread_id=run.thread_id,
        fence=fence,
        call=call,
        content=content,
        is_error=is_error,
        own_outbox=own_outbox,
        next_entry=following,
        now=now,
        kind=kind,
        # A read_only call reached in order: losing its result to a crash of PostgreSQL costs a
        # rerun, which its effect allows, and what it publishes checks that it settled.
        wait_for_flush=call.effect != "read_only" or call.batch is not None,
    )
    if moved is None:
        raise FenceLost(run.id, fence)
    return ("error" if is_error else "completed"), [following]


def record_call_result(
    tx: Tx,
    run: Run,
    call: CallRow,
    *,
    fence: int,
    content: str,
    is_error: bool,
    ends_turn: bool,
    now: datetime,
    resume: bool = False,
    own_outbox: bool = True,
    fails_run: str | None = None,
    kind: str | None = None,
    gives_output: bool = False,
) -> tuple[str, list[OutboxEntry]]:
    """Commit a call's result as a tool message and record what runs next (fenced), in ``tx``.

    The next task is the following call of the same model reply, or the next model step after
    the last one; a successful ``ends_turn`` call ends the run instead, with the reply's text as
    its output (``gives_output``: with the call's result, an output tool's). ``resume`` sets a run
    that waited for a person back to running. ``own_outbox=False`` says the call's outbox row
    was consumed already (by its claim). ``fails_run`` ends the run in error with that reason
    after the result (a failure no model can fix, such as a secret this worker cannot decrypt).
    """
    following = None if fails_run else _next_entry(tx, run, call, ends_run=ends_turn and not is_error)
    moved = tx.commit_call_result(
        run_id=run.id,
        thread_id=run.thread_id,
        fence=fence,
        call=call,
        content=content,
        is_error=is_error,
        own_outbox=own_outbox,
        next_entry=following,
        now=now,
        resume=resume,
        kind=kind,
    )
    if moved is None:
        raise FenceLost(run.id, fence)
    if run.agent_tool_run_id is not None:
        child_signal(
            tx,
            run.agent_tool_run_id,
            now,
            chunk={"role": "tool", "name": call.tool, "text": content, "is_error": is_error},
        )
    if following is None:
        skipped = _skip_rest_of_step(tx, run, call, now)
        if fails_run:
            entries = finish(tx, run, fence=moved, status="error", now=now, error=fails_run)
            return f"ended the run in error{f' (skipped {skipped})' if skipped else ''}", entries
        output = content if gives_output else _last_assistant_text(tx, run)
        entries = finish(tx, run, fence=moved, status="completed", now=now, output=output)
        return f"ended the turn{f' (skipped {skipped})' if skipped else ''}", entries
    return ("error" if is_error else "completed"), [following]


def _known_next_entry(run: Run, call: CallRow, step_queue: str | None, *, ends_run: bool) -> OutboxEntry | None:
    """The task after ``call`` if it is known without a query; None when the run finishes or
    the next call must be read (either way, :func:`record_call_result` in a transaction)."""
    following = after_call(call, ends_turn=ends_run)
    if isinstance(following, FinishRun):
        return None
    if isinstance(following, NextStep):
        return step_entry(run, run.step, run.agent, step_queue)
    return tool_entry(*call.next_call) if call.next_call is not None else None


def _next_entry(tx: Tx, run: Run, call: CallRow, *, ends_run: bool) -> OutboxEntry | None:
    """The task after ``call`` (None: the run finishes): the next model step after the reply's
    last call, else the next call of the reply."""
    following = after_call(call, ends_turn=ends_run)
    if isinstance(following, FinishRun):
        return None
    if isinstance(following, NextStep):
        return step_entry(run, run.step, run.agent, agent_queue(tx, run.agent))
    if call.next_call is not None:  # read with the call: no query for it
        return tool_entry(*call.next_call)
    next_call = tx.get_next_call(run.id, call.step, following.index)
    return tool_entry(next_call.effect_key, next_call.tool, next_call.queue)


def _skip_rest_of_step(tx: Tx, run: Run, call: CallRow, now: datetime) -> int:
    """Settle the calls after an ends_turn call as skipped, so every call has a result."""
    rest = [c for c in tx.calls_in_step(run.id, call.step) if c.index > call.index]
    for later in rest:
        text = f"skipped: {call.tool} ended the turn"
        tx.settle_call(later.effect_key, status="skipped", result=text, is_error=True, now=now)
        tx.insert_message(
            thread_id=run.thread_id,
            run_id=run.id,
            role="tool",
            text=text,
            now=now,
            tool_result=ToolResult(call_id=later.call_id, name=later.tool, content=text, is_error=True),
        )
    return len(rest)


def _last_assistant_text(tx: Tx, run: Run) -> str:
    for message in reversed(tx.list_messages(run.thread_id)):
        if message.role == "assistant" and message.run_id == run.id:
            return message.text
    return ""
