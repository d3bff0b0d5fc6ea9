"""A model step's commit: the reply, its usage and its tool calls in one fenced transaction.

After the model answered, :func:`commit_step` moves the run to its next step, records the token
usage, stores the assistant message and one ledger row per tool call (with the effect, dedup
window, finality and queue pinned from the tool as defined now), and records what runs next
(:func:`~threads_celery.decisions.next_step.after_reply`): the first call, or the first wave of a
concurrent group that opens the reply, or the run's finish when the reply has no calls. The
outbox rows are published right after the commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from threads_celery.decisions.next_step import NextCall, after_reply
from threads_celery.decisions.permissions import Allow as PermissionAllow
from threads_celery.definitions.agents import Agent
from threads_celery.definitions.hooks import Stop
from threads_celery.definitions.tools import Tool
from threads_celery.exceptions import FenceLost
from threads_celery.records import OutboxEntry, Run, ToolCall
from threads_celery.runtime import batches, hooks, models
from threads_celery.runtime.permission_checks import check_call
from threads_celery.runtime.ports import Worker
from threads_celery.store.operations import Reply, StepUsage, commit_last_reply_in, commit_reply_in
from threads_celery.store.repository import Tx, args_digest
from threads_celery.transitions import runs
from threads_celery.transitions.agent_tools import child_signal


def commit_step(
    worker: Worker,
    run: Run,
    fence: int,
    step: int,
    agent: Agent,
    turn: models.ModelTurn,
    started: list[dict[str, Any]] | None = None,
) -> str:
    """Commit model step ``step``'s reply (fenced) and publish what runs next; returns what happened.

    ``started``: the payloads of the ``tool_call_started`` events the step held back, recorded
    with the reply (before its message's event) and emptied once committed."""
    now = worker.clock()
    held = tuple(started or ())
    calls = [
        (
            runs.effect_key_for(run.id, step, i),
            requested,
            agent.tool_named(requested.name),
        )
        for i, requested in enumerate(turn.calls)
    ]
    plan = batches.plan_groups([_may_run_concurrently(worker, run, agent, t) for _, _, t in calls])
    usage = _usage(worker, agent, turn, 1 + run.voided_after_claim(step))
    asked = tuple(ToolCall(id=r.call_id, name=r.name, args=r.args, effect_key=key) for key, r, _ in calls)
    following = after_reply(len(calls))
    entries: list[OutboxEntry] = []
    if isinstance(following, NextCall):
        # The first call, or the first wave of a concurrent group that opens the reply.
        first = following.index
        wave = (
            batches.first_wave(first, batches.group_end(plan, first), worker.settings.max_parallel_tool_calls)
            if plan[first] is not None
            else range(first, first + 1)
        )
        for i in wave:
            key, requested, t = calls[i]
            entries.append(runs.tool_entry(key, requested.name, t.queue if t else None))
        reply = Reply(
            run_id=run.id,
            thread_id=run.thread_id,
            fence=fence,
            step=step,
            now=now,
            usage=usage,
            text=turn.text,
            tool_calls=asked,
            call_rows=tuple(
                _call_row(run, step, i, key, requested, t, plan[i], len(calls), now)
                for i, (key, requested, t) in enumerate(calls)
            ),
            entries=tuple(entries),
            started=held,
        )
        if run.agent_tool_run_id is None:
            moved = worker.store.commit_reply(reply)
        else:
            with worker.store.transaction() as tx:
                moved = commit_reply_in(tx, reply)
                if moved is not None:
                    _signal_parent(tx, run, turn, now, [r.name for _, r, _ in calls])
        if moved is None:
            raise FenceLost(run.id, fence)
        outcome = f"called {', '.join(r.name for _, r, _ in calls)}"
    elif run.agent_tool_run_id is None:
        # The run's last reply, and its end, in one transaction with the thread handed on.
        last = Reply(
            run_id=run.id, thread_id=run.thread_id, fence=fence, step=step, now=now, usage=usage, text=turn.text,
            tool_calls=(), call_rows=(), entries=(), started=held,
        )  # fmt: skip
        with worker.store.transaction() as tx:
            if commit_last_reply_in(tx, last) is None:
                raise FenceLost(run.id, fence)
            entries.extend(runs.finished(tx, run, status="completed", now=now, output=turn.text))
        outcome = "completed"
    else:
        # An agent tool's child: its parent hears of the reply before the run's end.
        with worker.store.transaction() as tx:
            moved = tx.advance_run(run.id, fence=fence, now=now, step=step + 1, lease_owner=None, lease_expires_at=None)
            if moved is None:
                raise FenceLost(run.id, fence)
            for payload in held:
                tx.append_event(run.thread_id, run.id, "tool_call_started", payload, now)
            _record_usage(tx, run, step, usage, now)
            tx.insert_message(thread_id=run.thread_id, run_id=run.id, role="assistant", text=turn.text, now=now)
            _signal_parent(tx, run, turn, now, [])
            entries.extend(runs.finish(tx, run, fence=moved, status="completed", now=now, output=turn.text))
        outcome = "completed"
    if started is not None:
        started.clear()  # committed with the reply
    worker.publish(entries)
    if outcome == "completed":
        hooks.observe_stop(agent, run, step, Stop("completed", output=turn.text))
    return outcome


def _call_row(
    run: Run,
    step: int,
    i: int,
    key: str,
    requested: models.RequestedCall,
    t: Tool | None,
    batch: int | None,
    count: int,
    now: datetime,
) -> dict[str, Any]:
    """The ledger row of the reply's call ``i``, its effect, dedup window, finality and queue
    pinned from the tool as defined now."""
    return {
        "effect_key": key,
        "run_id": run.id,
        "thread_id": run.thread_id,
        "step": step,
        "idx": i,
        "calls_in_step": count,
        "call_id": requested.call_id,
        "tool": requested.name,
        "args": requested.args,
        "args_hash": args_digest(requested.args),
        "effect": t.effect if t else "read_only",
        "dedup_window_ms": t.dedup_window_ms if t else None,
        "finality": t.reconcile.finality if t and t.reconcile else None,
        "queue": t.queue if t else None,
        "status": "pending",
        "attempt": 0,
        "is_error": False,
        "created_at": now,
        "batch": batch,
    }


def _signal_parent(tx: Tx, run: Run, turn: models.ModelTurn, now: datetime, called: list[str]) -> None:
    """An agent-tool child's step: it showed life, and its message goes to the parent's log."""
    assert run.agent_tool_run_id is not None
    child_signal(
        tx,
        run.agent_tool_run_id,
        now,
        chunk={"role": "assistant", "text": turn.text, "tool_calls": called},
    )


def _usage(worker: Worker, agent: Agent, turn: models.ModelTurn, requests: int) -> StepUsage:
    """The step's usage: ``requests`` attempts (those voided before this one included), each
    counted with this one's tokens (the same prompt; a reply as long)."""
    input_tokens = int(turn.usage.get("input_tokens", 0)) * requests
    output_tokens = int(turn.usage.get("output_tokens", 0)) * requests
    identity = agent.model_identity()
    return StepUsage(
        agent=agent.name,
        model=turn.model_name or identity,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=worker.settings.model_prices.cost((identity, turn.model_name), input_tokens, output_tokens),
        requests=requests,
    )


def _record_usage(tx: Tx, run: Run, step: int, usage: StepUsage, now: datetime) -> None:
    tx.record_usage(
        run_id=run.id,
        step=step,
        thread_id=run.thread_id,
        agent=usage.agent,
        model=usage.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost=usage.cost,
        now=now,
        requests=usage.requests,
    )


def _may_run_concurrently(worker: Worker, run: Run, agent: Agent, tool: Tool | None) -> bool:
    """A concurrent tool whose call the permissions allow outright (no person to wait for)."""
    if tool is None or not tool.concurrent:
        return False
    return isinstance(check_call(worker.store, worker.registry, run, agent, tool), PermissionAllow)
