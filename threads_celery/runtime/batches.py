"""Concurrent tool calls: which calls of one model reply run together, and how their results
join the conversation in call order.

A *group* is a run of two or more consecutive calls of one reply whose tools are
``concurrent=True`` (read_only by definition). Each call of a group is its own ``threads.tool``
task; at most ``max_parallel_tool_calls`` of them are in flight, and a call that records its
result hands its slot to the call ``limit`` places after it. A call that finishes records its
result on its ledger row (status ``finished``); whoever records makes every finished call that
has no unshown call before it a tool message, in call order, and the call that completes the
group records what runs next. A call before or after the group keeps its place: the group starts
when the call before it is recorded, and the call after it is due only when the whole group is.

Each recording is one transaction holding the run's row lock, so siblings' commits queue rather
than race; a read_only call records no claim before it runs (one commit per call, as in
sequence), so after a crash its outbox row falls due and the backbone runs it again.

The planning functions are pure (what runs once a group is complete is
:func:`threads_celery.decisions.next_step.after_results`); :func:`record_concurrent_result` and
:func:`open_group` are the shell.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from threads_celery.decisions.next_step import NextStep, after_results
from threads_celery.exceptions import FenceLost
from threads_celery.records import CallRow, OutboxEntry, Run, ToolResult
from threads_celery.runtime.ports import Ledger
from threads_celery.store import Tx
from threads_celery.transitions import runs
from threads_celery.transitions.agent_tools import child_signal

#: Statuses of a call whose result the model has been shown.
SHOWN = frozenset({"completed", "error", "skipped"})


def plan_groups(concurrent: Sequence[bool]) -> tuple[int | None, ...]:
    """For each call of a reply, the index of the first call of its group, or None (in order).

    Only runs of two or more consecutive concurrent calls form a group: a lone concurrent call
    gains nothing from running as one.
    """
    plan: list[int | None] = [None] * len(concurrent)
    start = 0
    while start < len(concurrent):
        end = start
        while end < len(concurrent) and concurrent[end]:
            end += 1
        if end - start >= 2:
            plan[start:end] = [start] * (end - start)
        start = max(end, start + 1)
    return tuple(plan)


def group_end(plan: Sequence[int | None], start: int) -> int:
    """One past the last call of the group that begins at ``start``."""
    end = start
    while end < len(plan) and plan[end] == start:
        end += 1
    return end


def first_wave(start: int, end: int, limit: int) -> range:
    """The calls of a group that are dispatched when it opens."""
    return range(start, min(end, start + limit))


def slot_successor(index: int, end: int, limit: int) -> int | None:
    """The call that takes over ``index``'s slot when it records, if any."""
    following = index + limit
    return following if following < end else None


def slot_chain(index: int, end: int, limit: int) -> list[int]:
    """Every call that would run in ``index``'s slot after it (what a cancel skips with it)."""
    chain: list[int] = []
    following = slot_successor(index, end, limit)
    while following is not None:
        chain.append(following)
        following = slot_successor(following, end, limit)
    return chain


def ready_to_show(statuses: Sequence[str]) -> tuple[list[int], bool]:
    """Which calls of a group (positions) to show now, and whether the group is then complete.

    Results are shown in call order: a finished call waits for every call before it.
    """
    show: list[int] = []
    for position, status in enumerate(statuses):
        if status == "finished":
            show.append(position)
        elif status not in SHOWN:
            return show, False
    return show, True


# -- the shell ---------------------------------------------------------------------------------


def _entry(call: CallRow) -> OutboxEntry:
    return runs.tool_entry(call.effect_key, call.tool, call.queue)


def open_group(ledger: Ledger, call: CallRow, limit: int) -> None:
    """The first call of a group that follows a call in order: dispatch the group's first wave
    (at most ``limit`` calls).

    (A group at the start of a reply is dispatched with the model step's own commit.)
    Idempotent: only calls that have not recorded a result get a row, and a row that exists
    stays as it is.
    """
    now = ledger.clock()
    entries: list[OutboxEntry] = []
    with ledger.store.transaction() as tx:
        group = [c for c in tx.calls_in_step(call.run_id, call.step) if c.batch == call.batch]
        end = call.index + len(group)
        for member in group:
            if (
                member.index in first_wave(call.index, end, limit)
                and member.status == "pending"
                and member.index != call.index
            ):
                entry = _entry(member)
                tx.insert_outbox(entry, now)
                entries.append(entry)
    ledger.publish(entries)


def record_concurrent_result(
    ledger: Ledger, run: Run, call: CallRow, content: str, *, is_error: bool, limit: int, fails_run: str | None = None
) -> str:
    """Record one concurrent call's result, show what is ready in call order, and move on
    (``limit`` calls of the group run at once).

    ``fails_run`` (a failure no model can fix, such as a secret this worker cannot decrypt) ends
    the run in error right after the result is recorded, as a cancel would: siblings still running
    record theirs on their calls, and the calls waiting for a slot never start.
    """
    now = ledger.clock()
    with ledger.store.transaction() as tx:
        current = tx.get_run(run.id, lock=True)
        loaded = tx.get_call_and_run(call.effect_key, lock=True)
        if current is None or loaded is None:
            return "skipped: no such call"
        if loaded[0].status != "pending":
            return "skipped: recorded by another delivery"
        tx.settle_call(call.effect_key, status="finished", result=content, is_error=is_error, now=now)
        tx.delete_outbox(call.effect_key)
        if current.status != "running" or current.step != call.step + 1:
            # Cancelled (or moved on): the result is kept on the call, and the calls that would
            # have taken over its slot never start.
            if current.is_terminal:
                _skip_slot_chain(tx, call, now, limit)
            return f"recorded; the run is {current.status}"
        if fails_run:
            entries = runs.finish(tx, current, fence=current.fence, status="error", now=now, error=fails_run)
            _skip_slot_chain(tx, call, now, limit)
        else:
            group = [c for c in tx.calls_in_step(run.id, call.step) if c.batch == call.batch]
            entries = _record(tx, current, call, group, now, limit)
    ledger.publish(entries)
    if fails_run:
        return "ended the run in error"
    return "error" if is_error else "completed"


def _record(tx: Tx, run: Run, call: CallRow, group: list[CallRow], now: datetime, limit: int) -> list[OutboxEntry]:
    assert call.batch is not None
    start, end = call.batch, call.batch + len(group)
    entries: list[OutboxEntry] = []
    successor = slot_successor(call.index, end, limit)
    if successor is not None and group[successor - start].status == "pending":
        entry = _entry(group[successor - start])
        tx.insert_outbox(entry, now)
        entries.append(entry)
    show, complete = ready_to_show([c.status for c in group])
    for position in show:
        shown = group[position]
        content = shown.result or ""
        tx.update_call(shown.effect_key, status="error" if shown.is_error else "completed")
        tx.insert_message(
            thread_id=run.thread_id,
            run_id=run.id,
            role="tool",
            text=content,
            now=now,
            tool_result=ToolResult(call_id=shown.call_id, name=shown.tool, content=content, is_error=shown.is_error),
        )
        if run.agent_tool_run_id is not None:
            chunk = {
                "role": "tool",
                "name": shown.tool,
                "text": content,
                "is_error": shown.is_error,
            }
            child_signal(tx, run.agent_tool_run_id, now, chunk=chunk)
    if not complete:
        return entries
    if tx.advance_run(run.id, fence=run.fence, now=now, lease_owner=None, lease_expires_at=None) is None:
        raise FenceLost(run.id, run.fence)
    following = after_results(end, call.calls_in_step)
    if isinstance(following, NextStep):
        entry = runs.step_entry(run, run.step, run.agent, runs.agent_queue(tx, run.agent))
    else:
        entry = _entry(tx.get_next_call(run.id, call.step, following.index))
    tx.insert_outbox(entry, now)
    return [*entries, entry]


SKIPPED = "skipped: the run ended before this call started"


def skip_cancelled(tx: Tx, call: CallRow, now: datetime, limit: int) -> None:
    """A group's call that never started in a run that ended: settle it (and the calls that
    would have followed it in its slot) as skipped."""
    if call.batch is not None and call.status == "pending":
        tx.settle_call(call.effect_key, status="skipped", result=SKIPPED, is_error=True, now=now)
        _skip_slot_chain(tx, call, now, limit)
    tx.delete_outbox(call.effect_key)


def _skip_slot_chain(tx: Tx, call: CallRow, now: datetime, limit: int) -> None:
    assert call.batch is not None
    group = {c.index: c for c in tx.calls_in_step(call.run_id, call.step) if c.batch == call.batch}
    end = call.batch + len(group)
    for index in slot_chain(call.index, end, limit):
        later = group[index]
        if later.status == "pending":
            tx.settle_call(later.effect_key, status="skipped", result=SKIPPED, is_error=True, now=now)
            tx.delete_outbox(later.effect_key)
