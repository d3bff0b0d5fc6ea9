"""What waits for a person under a run: its own calls, and its children's, all the way down.

A child run's call that waits for approval (or a variable, or a person after a crash) shows at
every ancestor run as a pending entry of kind ``child``: the parent's watcher (``threads-celery
run --approve``, the web page, the HTTP API) sees it and answers it by its effect key, as any
other. The parent itself keeps waiting on its child; nothing about the child's call changes.

Each change is also announced in the ancestors' event logs (``pending.child`` when a child's
call starts to wait, ``pending.answered`` when someone answers it), so a live view reloads its
list without polling.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from threads_celery.exceptions import FenceLost
from threads_celery.records import CallRow, Run
from threads_celery.store import Store, Tx

#: Call statuses that wait for a person.
WAITING = ("parked", "awaiting_approval", "awaiting_variable")
#: How deep a tree of child runs is followed (a guard against a cycle in bad data).
MAX_DEPTH = 32


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call that waits for a person: parked after an interruption, or awaiting approval."""

    effect_key: str
    run_id: str
    thread_id: str
    tool: str
    args: str
    status: str
    reason: str
    attempt: int
    first_started_at: datetime | None
    #: "call": a call of the run itself; "child": a call of a child run it waits on (answer it
    #: here, by its effect key, as any other).
    kind: Literal["call", "child"] = "call"
    #: For a child entry: the agent whose call it is, and the agent-tool run it came through.
    agent: str | None = None
    via: str | None = None

    @classmethod
    def of(cls, call: CallRow) -> PendingCall:
        return cls(
            effect_key=call.effect_key,
            run_id=call.run_id,
            thread_id=call.thread_id,
            tool=call.tool,
            args=call.args,
            status=call.status,
            reason=call.park_reason or "",
            attempt=call.attempt,
            first_started_at=call.first_started_at,
        )


def _ancestors(tx: Tx, run: Run) -> Iterator[tuple[str, str | None, str]]:
    """(thread id, run id, agent-tool run id) of each ancestor run, nearest first."""
    current: Run | None = run
    for _ in range(MAX_DEPTH):
        if current is None or current.agent_tool_run_id is None:
            return
        row = tx.get_agent_tool_run(current.agent_tool_run_id)
        if row is None:
            return
        yield row.parent_thread_id, row.parent_run_id, row.run_id
        current = tx.get_run(row.parent_run_id) if row.parent_run_id is not None else None


def _announce(tx: Tx, run: Run, event: str, payload: dict[str, Any], now: datetime) -> None:
    for thread_id, run_id, via in _ancestors(tx, run):
        tx.append_event(thread_id, run_id, event, {**payload, "kind": "child", "via": via}, now)


def wait_for_a_person(
    store: Store, run: Run, call: CallRow, reason: str, *, status: str, now: datetime, fence: int | None = None
) -> None:
    """The run waits for a person at ``call`` (approval, a variable's value, or parked after a
    crash), holding no worker; a child run's call is announced to its ancestors. ``fence``: the
    run's fence when a claim moved it past the one read with ``run``."""
    fence = run.fence if fence is None else fence
    with store.transaction() as tx:
        moved = tx.advance_run(run.id, fence=fence, now=now, status=status, lease_owner=None, lease_expires_at=None)
        if moved is None:
            raise FenceLost(run.id, fence)
        if status == "parked":
            tx.park_call(call.effect_key, reason=reason)
        else:
            tx.update_call(call.effect_key, status=status, park_reason=reason)
        tx.delete_outbox(call.effect_key)
        if run.agent_tool_run_id is not None:
            announce_pending(tx, run, call, status=status, reason=reason, now=now)


def announce_pending(tx: Tx, run: Run, call: CallRow, *, status: str, reason: str, now: datetime) -> None:
    """A child run's call started to wait for a person: tell every ancestor's event log."""
    payload = {
        "effect_key": call.effect_key,
        "tool": call.tool,
        "status": status,
        "reason": reason,
        "child_run_id": run.id,
        "agent": run.agent,
    }
    _announce(tx, run, "pending.child", payload, now)


def announce_answer(tx: Tx, run: Run, call: CallRow, answer: str, now: datetime) -> None:
    """Someone answered a child run's waiting call: tell every ancestor's event log."""
    payload = {
        "effect_key": call.effect_key,
        "tool": call.tool,
        "answer": answer,
        "child_run_id": run.id,
    }
    _announce(tx, run, "pending.answered", payload, now)


def pending_under(tx: Tx, run_id: str) -> list[PendingCall]:
    """The run's own calls that wait for a person, then its children's (kind ``child``)."""
    run = tx.get_run(run_id)
    if run is None:
        return []
    found = [PendingCall.of(c) for c in _waiting_calls(tx, run)]
    frontier: list[tuple[Run, str | None]] = [(run, None)]
    for _ in range(MAX_DEPTH):
        following: list[tuple[Run, str | None]] = []
        for parent, via in frontier:
            for row in tx.list_agent_tool_runs(parent.thread_id, statuses=("starting", "running")):
                if row.parent_run_id != parent.id or row.child_run_id is None:
                    continue
                child = tx.get_run(row.child_run_id)
                if child is None or child.is_terminal:
                    continue
                through = via or row.run_id
                found.extend(
                    replace(PendingCall.of(c), kind="child", agent=child.agent, via=through)
                    for c in _waiting_calls(tx, child)
                )
                following.append((child, through))
        if not following:
            break
        frontier = following
    return found


def _waiting_calls(tx: Tx, run: Run) -> list[CallRow]:
    if run.is_terminal or run.step < 1:
        return []
    return [c for c in tx.calls_in_step(run.id, run.step - 1) if c.status in WAITING]
