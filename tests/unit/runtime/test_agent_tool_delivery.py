"""Finish delivery and budgets of agent-tool runs, on the embedded runtime (no services).

Delivery is a claim-and-lease ledger on the agent-tool row: each finish status fires the
parent's hooks once on the happy path, at least once under a crash or a raising hook. Budgets
are enforced by the reconcile backbone, which these tests tick by hand (``threads.reconcile()``);
where a test needs time to pass it either polls the real clock with a deadline (budgets of a few
hundred milliseconds) or ticks a second runtime on the same store with a clock of its own.
The concurrent delivery of one finish from two threads runs on PostgreSQL in
``tests/integration/test_agent_tools_workers.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery.signals import task_postrun
from sqlalchemy import select, update

from tests.support.agent_tool_agents import (
    Gate,
    RecordingParent,
    agent_tool_events,
    delivered,
    eventually,
    gated_child,
    idle_parent,
    quick_child,
    unique,
)
from threads_celery import ConfigError, Detached, Threads, agent_tool
from threads_celery.records import AgentToolFailure, AgentToolResult
from threads_celery.runtime.machine import Runtime
from threads_celery.store.schema import agent_tool_runs
from threads_celery.testing import call, say
from threads_celery.transitions import agent_tool_dispatch, agent_tools, runs

pytestmark = pytest.mark.embedded(concurrency=4)

WAIT_S = 30.0


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.opened.set()


@pytest.fixture
def finished_tasks() -> Iterator[list[tuple[str, tuple[Any, ...], Any]]]:
    """(task name, args, return value) of every task the embedded worker finishes meanwhile."""
    seen: list[tuple[str, tuple[Any, ...], Any]] = []

    def record(sender: Any = None, args: Any = None, retval: Any = None, **_: Any) -> None:
        seen.append((getattr(sender, "name", ""), tuple(args or ()), retval))

    task_postrun.connect(record, weak=False)
    yield seen
    task_postrun.disconnect(record)


class FlakyParent(RecordingParent):
    """``on_flaky`` raises for its first ``failures`` calls, then records like ``on_done``."""

    def __init__(self, name: str, failures: int = 1) -> None:
        super().__init__(name)
        self.failures = failures
        self.attempts: list[str] = []

    def on_flaky(self, run: Any, result: Any) -> None:
        self.attempts.append(result.status)
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the on_finish handler failed")
        self.done.append((run.run_id, result))


class BlockingParent(RecordingParent):
    """``on_slow`` blocks until the test releases it (a delivery in progress)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.inside = threading.Event()
        self.release = threading.Event()

    def on_slow(self, run: Any, result: Any) -> None:
        self.inside.set()
        assert self.release.wait(WAIT_S)
        self.done.append((run.run_id, result))


def ledger(threads: Threads, run_id: str) -> Any:
    """The raw agent-tool row, with the delivery columns the snapshot does not show."""
    with threads.store.read() as tx:
        return tx.conn.execute(select(agent_tool_runs).where(agent_tool_runs.c.run_id == run_id)).one()._mapping


def set_ledger(threads: Threads, run_id: str, **values: Any) -> None:
    with threads.store.transaction() as tx:
        tx.conn.execute(update(agent_tool_runs).where(agent_tool_runs.c.run_id == run_id).values(**values))


def give_up(threads: Threads, run_id: str, *, reason: str, child_still_running: bool) -> None:
    """Seal the run interrupted, as the backbone does, and publish its delivery."""
    with threads.store.transaction() as tx:
        row = tx.get_agent_tool_run(run_id, lock=True)
        entries = agent_tools.seal_interrupted(
            tx,
            row,
            reason=reason,
            error=f"gave up: {reason}",
            child_still_running=child_still_running,
            now=runs.utcnow(),
        )
    threads.publisher(entries)


def tick_until(threads: Threads, predicate: Any, what: str) -> Any:
    """Tick the backbone until ``predicate()`` holds."""

    def probe() -> Any:
        threads.reconcile()
        return predicate()

    return eventually(probe, timeout=WAIT_S, what=what)


def interrupted_row(threads: Threads, run_id: str) -> Any:
    row = threads.inspect_agent_tool_run(run_id)
    return row if row is not None and row.status == "interrupted" else None


def outbox_keys(threads: Threads) -> list[str]:
    with threads.store.read() as tx:
        return tx.outbox_keys()


def fake_clock_runtime(threads: Threads, start: datetime) -> tuple[Runtime, list[datetime]]:
    """A second runtime on the same store whose clock the test moves (``now[0] = ...``)."""
    now = [start]
    return Runtime(threads.store, threads.registry, publish=threads.publisher, clock=lambda: now[0]), now


# -- the delivery ledger ---------------------------------------------------------------------


def test_two_deliveries_of_the_same_finish_fire_on_finish_and_the_global_hook_once(threads: Threads) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_done"))
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the delivery")
    runtime = threads.app.threads_runtime.get()
    assert runtime.deliver(handle.run_id, "completed") == "skipped: already delivered"
    assert runtime.deliver(handle.run_id, "completed") == "skipped: already delivered"
    assert [run_id for run_id, _ in parent.done] == [handle.run_id]
    assert parent.finishes == [(handle.run_id, "completed")]


def test_a_delivery_that_arrives_while_another_is_in_progress_does_nothing(threads: Threads) -> None:
    parent = BlockingParent(unique("blocking"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_slow"))
    assert parent.inside.wait(WAIT_S), "the worker never started delivering"
    runtime = threads.app.threads_runtime.get()
    try:
        assert runtime.deliver(handle.run_id, "completed") == "skipped: another delivery holds the claim"
    finally:
        parent.release.set()
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the delivery")
    assert runtime.deliver(handle.run_id, "completed") == "skipped: already delivered"
    assert len(parent.done) == 1 and parent.finishes == [(handle.run_id, "completed")]


def test_a_delivered_finish_leaves_no_delivery_task_behind(threads: Threads) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_done"))
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the delivery")
    # The backbone republishes what is left in the outbox: a delivered finish must not be there,
    # or every retained run would be delivered again (as a no-op) forever.
    eventually(
        lambda: not [k for k in outbox_keys(threads) if k.startswith(f"deliver:{handle.run_id}:")],
        what="the delivery's outbox row to go",
    )
    row = ledger(threads, handle.run_id)
    assert (row["delivery_owner"], row["delivery_lease_until"]) == (None, None)


def test_a_raising_on_finish_is_not_marked_delivered_and_is_redelivered_after_its_lease(threads: Threads) -> None:
    parent = FlakyParent(unique("flaky"), failures=1)
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(
        parent_thread, quick_child("late but fine"), input="x", detached=Detached(on_finish="on_flaky")
    )
    eventually(lambda: parent.attempts == ["completed"], what="the first delivery attempt")

    # The failed attempt gives its claim back with a short backoff, not the whole lease.
    def backoff_lease() -> datetime | None:
        until = ledger(threads, handle.run_id)["delivery_lease_until"]
        return until if until is not None and until < runs.utcnow() + timedelta(seconds=30) else None

    lease = eventually(backoff_lease, what="the backoff after the failure")
    assert lease > runs.utcnow()
    assert threads.inspect_agent_tool_run(handle.run_id).delivered == ()

    runtime = threads.app.threads_runtime.get()
    assert runtime.deliver(handle.run_id, "completed") == "skipped: another delivery holds the claim"
    assert "redelivered" not in threads.reconcile()  # the lease has not run out
    assert parent.attempts == ["completed"]

    set_ledger(threads, handle.run_id, delivery_lease_until=runs.utcnow() - timedelta(seconds=1))
    assert threads.reconcile().get("redelivered") == 1
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the redelivery")
    assert parent.attempts == ["completed", "completed"]
    [(run_id, result)] = parent.done
    assert run_id == handle.run_id and isinstance(result, AgentToolResult) and result.summary == "late but fine"
    assert "redelivered" not in threads.reconcile()


def test_a_failing_delivery_backs_off_5_15_30_then_120_seconds(
    threads: Threads, finished_tasks: list[tuple[str, tuple[Any, ...], Any]]
) -> None:
    parent = FlakyParent(unique("flaky"), failures=5)
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_flaky"))
    backoffs = []
    for attempt in range(1, 6):
        if attempt > 1:
            set_ledger(threads, handle.run_id, delivery_lease_until=runs.utcnow() - timedelta(seconds=1))
            assert threads.reconcile().get("redelivered") == 1
        eventually(
            lambda attempt=attempt: (
                [r for name, args, r in finished_tasks if name == "threads.deliver" and args[0] == handle.run_id]
                == ["failed: RuntimeError"] * attempt
            ),
            what=f"delivery attempt {attempt} to fail",
        )
        assert len(parent.attempts) == attempt
        until = ledger(threads, handle.run_id)["delivery_lease_until"]
        backoffs.append((until - runs.utcnow()).total_seconds())
    expected = [5, 15, 30, 120, 120]
    assert all(want - 3 <= got <= want for got, want in zip(backoffs, expected, strict=True)), backoffs
    assert threads.inspect_agent_tool_run(handle.run_id).delivered == ()


def test_a_give_up_then_a_real_completion_delivers_both_and_repairs_the_row(threads: Threads, gate: Gate) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(
        parent_thread, gated_child(gate, "done after all"), input="x", detached=Detached(on_finish="on_done")
    )
    gate.wait_inside()
    # A budget give-up whose teardown did not reach the child: it goes on and finishes.
    give_up(threads, handle.run_id, reason="budget-exceeded", child_still_running=True)
    eventually(lambda: delivered(threads, handle.run_id, "interrupted"), what="the give-up's delivery")
    [(_, gave_up)] = parent.done
    assert isinstance(gave_up, AgentToolFailure)
    assert (gave_up.status, gave_up.reason, gave_up.retryable) == ("interrupted", "budget-exceeded", True)

    gate.opened.set()
    row = eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the completion's delivery")
    assert (row.status, row.reason, row.child_still_running, row.error) == ("completed", None, None, None)
    assert sorted(row.delivered) == ["completed", "interrupted"]
    assert [res.status for _, res in parent.done] == ["interrupted", "completed"]
    assert parent.done[1][1].summary == "done after all"
    assert parent.finishes == [(handle.run_id, "interrupted"), (handle.run_id, "completed")]
    kinds = [t for t, _ in agent_tool_events(threads, parent_thread, handle.run_id)]
    assert kinds[-2:] == ["agent_tool.interrupted", "agent_tool.finished"]


def test_a_second_give_up_is_not_delivered_again(threads: Threads, gate: Gate) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, gated_child(gate), input="x", detached=Detached(on_finish="on_done"))
    gate.wait_inside()
    give_up(threads, handle.run_id, reason="no-progress", child_still_running=True)
    eventually(lambda: delivered(threads, handle.run_id, "interrupted"), what="the first give-up's delivery")
    give_up(threads, handle.run_id, reason="no-progress", child_still_running=True)
    runtime = threads.app.threads_runtime.get()
    assert runtime.deliver(handle.run_id, "interrupted") == "skipped: already delivered"
    gate.opened.set()
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the completion's delivery")
    assert [res.status for _, res in parent.done] == ["interrupted", "completed"]
    assert [status for _, status in parent.finishes] == ["interrupted", "completed"]


def test_a_completion_that_arrives_while_the_give_up_is_delivered_is_delivered_after_it(
    threads: Threads, gate: Gate, finished_tasks: list[tuple[str, tuple[Any, ...], Any]]
) -> None:
    from threads_celery.store.schema import outbox

    parent = BlockingParent(unique("blocking"))
    parent_thread = idle_parent(threads, parent)
    child = gated_child(gate, "finished meanwhile")
    handle = threads.run_agent_tool(parent_thread, child, input="x", detached=Detached(on_finish="on_slow"))
    gate.wait_inside()
    give_up(threads, handle.run_id, reason="no-progress", child_still_running=True)
    assert parent.inside.wait(WAIT_S), "the give-up was never delivered"
    try:
        gate.opened.set()  # the child finishes while the give-up's delivery holds the claim
        eventually(
            lambda: (
                ("threads.deliver", (handle.run_id, "completed"), "skipped: another delivery holds the claim")
                in finished_tasks
            ),
            what="the completion's first delivery attempt",
        )
    finally:
        parent.release.set()
    eventually(lambda: delivered(threads, handle.run_id, "interrupted"), what="the give-up's delivery")
    # The completion's task is still in the outbox; the backbone publishes it when it is due.
    key = f"deliver:{handle.run_id}:completed"
    assert key in outbox_keys(threads)
    with threads.store.transaction() as tx:
        tx.conn.execute(update(outbox).where(outbox.c.key == key).values(due_at=runs.utcnow() - timedelta(seconds=1)))
    threads.reconcile()
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the completion's delivery")
    assert [res.status for _, res in parent.done] == ["interrupted", "completed"]
    assert key not in outbox_keys(threads)


# -- budgets ---------------------------------------------------------------------------------


def test_max_budget_gives_up_tears_the_child_down_and_delivers_once(
    threads: Threads, gate: Gate, finished_tasks: list[tuple[str, tuple[Any, ...], Any]]
) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(
        parent_thread, gated_child(gate), input="x", detached=Detached(on_finish="on_done", max_budget_ms=300)
    )
    gate.wait_inside()
    row = tick_until(threads, lambda: interrupted_row(threads, handle.run_id), "the budget give-up")
    assert (row.reason, row.child_still_running) == ("budget-exceeded", False)
    assert threads.get_run(row.child_run_id).status == "aborted"  # torn down
    eventually(lambda: delivered(threads, handle.run_id, "interrupted"), what="the give-up's delivery")

    # The child's tool was still running: its late result is refused, and nothing more is delivered.
    [child_call] = [c for m in threads.messages(row.child_thread_id) for c in m.tool_calls]
    gate.opened.set()
    eventually(
        lambda: any(name == "threads.tool" and args == (child_call.effect_key,) for name, args, _ in finished_tasks),
        what="the child's tool task to end",
    )
    threads.reconcile()
    row = threads.inspect_agent_tool_run(handle.run_id)
    assert (row.status, row.reason, row.child_still_running) == ("interrupted", "budget-exceeded", False)
    assert [m.role for m in threads.messages(row.child_thread_id)] == ["user", "assistant"]
    assert [(r, res.status) for r, res in parent.done] == [(handle.run_id, "interrupted")]
    assert parent.finishes == [(handle.run_id, "interrupted")]
    interrupted = [
        p for t, p in agent_tool_events(threads, parent_thread, handle.run_id) if t == "agent_tool.interrupted"
    ]
    assert len(interrupted) == 1 and interrupted[0]["reason"] == "budget-exceeded"


def test_no_progress_gives_up_softly_and_a_later_completion_delivers_completed(threads: Threads, gate: Gate) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    gate.before = lambda ctx: ctx.report_progress(fraction=0.1, phase="starting")
    handle = threads.run_agent_tool(
        parent_thread,
        gated_child(gate, "self-healed"),
        input="x",
        detached=Detached(on_finish="on_done", no_progress_budget_ms=300),
    )
    gate.wait_inside()
    row = tick_until(threads, lambda: interrupted_row(threads, handle.run_id), "the no-progress give-up")
    assert (row.reason, row.child_still_running) == ("no-progress", True)
    assert threads.get_run(row.child_run_id).status == "running"  # soft: the child goes on
    eventually(lambda: delivered(threads, handle.run_id, "interrupted"), what="the give-up's delivery")
    [(_, gave_up)] = parent.done
    assert gave_up.to_json()["child_still_running"] is True and gave_up.retryable

    gate.opened.set()
    row = eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the completion's delivery")
    assert (row.status, row.reason, row.child_still_running, row.summary) == ("completed", None, None, "self-healed")
    assert [res.status for _, res in parent.done] == ["interrupted", "completed"]


def test_an_awaited_model_call_given_up_on_returns_the_interrupted_envelope_and_ignores_the_late_result(
    threads: Threads, gate: Gate
) -> None:
    import json

    child = gated_child(gate, "too late")
    parent = RecordingParent(
        unique("parent"),
        tools=[agent_tool(child, "Delegate.", name="delegate")],
        script=[call("delegate", message="x"), say("moved on")],
    )
    handle = threads.start(parent, "go")
    gate.wait_inside()
    [row] = threads.agent_tool_runs(handle.thread_id)
    assert (
        row.last_signal_at is not None
        and row.no_progress_budget_ms == agent_tool_dispatch.DEFAULT_AWAITED_NO_PROGRESS_MS
    )
    # The child has been silent for longer than the awaited window (120 s).
    past = runs.utcnow() - timedelta(seconds=130)
    set_ledger(threads, row.run_id, last_signal_at=past, check_at=past + timedelta(seconds=120))
    threads.reconcile()
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [tool_message] = [m for m in threads.messages(handle.thread_id) if m.role == "tool"]
    envelope = json.loads(tool_message.text)
    assert envelope["ok"] is False and envelope["status"] == "interrupted" and envelope["retryable"] is True
    assert (envelope["reason"], envelope["child_still_running"]) == ("no-progress", True)

    gate.opened.set()
    eventually(lambda: delivered(threads, row.run_id, "completed"), what="the late completion's delivery")
    assert [m.role for m in threads.messages(handle.thread_id)].count("tool") == 1
    assert threads.get_run(handle.run_id).status == "completed"


def test_a_fresh_signal_inside_the_window_leaves_the_run_running(threads: Threads, gate: Gate) -> None:
    parent_thread = idle_parent(threads, RecordingParent(unique("parent")))
    child = gated_child(gate)
    silent = threads.run_agent_tool(parent_thread, child, input="a", detached=Detached(no_progress_budget_ms=1000))
    chatty = threads.run_agent_tool(parent_thread, child, input="b", detached=Detached(no_progress_budget_ms=1000))
    eventually(lambda: gate.calls == 2, what="both children to reach the gate")
    start = max(threads.inspect_agent_tool_run(r.run_id).last_signal_at for r in (silent, chatty))
    assert start is not None
    runtime, now = fake_clock_runtime(threads, start)

    now[0] = start + timedelta(milliseconds=4500)
    assert runtime.progress.report(chatty.run_id, message="still here") == "sent"  # a fresh signal
    now[0] = start + timedelta(seconds=5)  # last signal 5 s ago for one, 0.5 s ago for the other
    runtime.reconcile_tick()
    silent_row, chatty_row = (threads.inspect_agent_tool_run(r.run_id) for r in (silent, chatty))
    assert (silent_row.status, silent_row.reason, silent_row.child_still_running) == (
        "interrupted",
        "no-progress",
        True,
    )
    assert chatty_row.status == "running"

    now[0] = start + timedelta(seconds=6)  # the chatty one falls silent too
    runtime.reconcile_tick()
    assert threads.inspect_agent_tool_run(chatty.run_id).status == "interrupted"
    gate.opened.set()


def test_a_heartbeat_from_the_child_resets_the_no_progress_window(threads: Threads) -> None:
    from pydantic import BaseModel

    from threads_celery import Agent, tool
    from threads_celery.testing import ScriptedModel

    entered, beat, beaten, opened = (threading.Event() for _ in range(4))

    def busy(inp: Any, ctx: Any) -> str:
        entered.set()
        assert beat.wait(WAIT_S)
        ctx.heartbeat()
        beaten.set()
        assert opened.wait(WAIT_S)
        return "busy work done"

    class NoInput(BaseModel):
        pass

    child = Agent(
        name=unique("beating_child"),
        instructions="",
        model=ScriptedModel([call("busy"), say("done")]),
        tools=[tool(name="busy", description="Work for a while.", input=NoInput, effect="read_only", execute=busy)],
    )
    parent_thread = idle_parent(threads, RecordingParent(unique("parent")))
    try:
        handle = threads.run_agent_tool(parent_thread, child, input="x", detached=Detached(no_progress_budget_ms=2000))
        assert entered.wait(WAIT_S)
        stale = runs.utcnow() - timedelta(seconds=10)
        set_ledger(threads, handle.run_id, last_signal_at=stale, check_at=stale + timedelta(seconds=2))
        beat.set()
        assert beaten.wait(WAIT_S)
        fresh = threads.inspect_agent_tool_run(handle.run_id).last_signal_at
        assert fresh > stale + timedelta(seconds=5)
        runtime, now = fake_clock_runtime(threads, fresh + timedelta(milliseconds=1500))
        runtime.reconcile_tick()
        assert threads.inspect_agent_tool_run(handle.run_id).status == "running"
        now[0] = fresh + timedelta(milliseconds=2500)
        runtime.reconcile_tick()
        assert threads.inspect_agent_tool_run(handle.run_id).reason == "no-progress"
    finally:
        beat.set()
        opened.set()


def test_a_child_whose_tool_is_still_running_is_not_silent(
    threads: Threads, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker renews a running call's lease every tool_lease_s / 3; make that 0.2 s here.
    runtime = threads.app.threads_runtime.get()
    monkeypatch.setattr(runtime, "settings", runtime.settings.with_(tool_lease_s=0.6))
    parent_thread = idle_parent(threads, RecordingParent(unique("parent")))
    handle = threads.run_agent_tool(
        parent_thread, gated_child(gate), input="x", detached=Detached(no_progress_budget_ms=1000)
    )
    gate.wait_inside()
    first = threads.inspect_agent_tool_run(handle.run_id).last_signal_at

    # The tool reports nothing, but its worker is alive: the silence window keeps moving.
    def moved_on() -> datetime | None:
        latest = threads.inspect_agent_tool_run(handle.run_id).last_signal_at
        return latest if latest > first + timedelta(milliseconds=400) else None

    later = eventually(moved_on, what="a lease renewal to count as a sign of life")
    assert later > first
    gate.opened.set()


@pytest.mark.parametrize(
    "budgets",
    [
        {"no_progress_budget_ms": 0, "max_budget_ms": float("inf")},
        {"no_progress_budget_ms": float("inf"), "max_budget_ms": float("inf")},
        {"no_progress_budget_ms": float("inf")},
    ],
    ids=["zero", "infinite", "infinite-with-default-ceiling"],
)
def test_zero_or_infinite_budgets_disable_the_give_up(threads: Threads, gate: Gate, budgets: dict[str, float]) -> None:
    parent_thread = idle_parent(threads, RecordingParent(unique("parent")))
    handle = threads.run_agent_tool(parent_thread, gated_child(gate), input="x", detached=Detached(**budgets))
    gate.wait_inside()
    row = threads.inspect_agent_tool_run(handle.run_id)
    assert row.no_progress_budget_ms is None and row.last_signal_at is not None
    runtime, now = fake_clock_runtime(threads, row.last_signal_at)
    # Never at once (an infinite budget once sealed runs immediately) ...
    runtime.reconcile_tick()
    assert threads.inspect_agent_tool_run(handle.run_id).status == "running"
    # ... nor after a long silence. Only the absolute ceiling, when finite, ends a run.
    now[0] = row.last_signal_at + timedelta(hours=23)
    runtime.reconcile_tick()
    assert threads.inspect_agent_tool_run(handle.run_id).status == "running"
    now[0] = row.last_signal_at + timedelta(days=30)
    runtime.reconcile_tick()
    after = threads.inspect_agent_tool_run(handle.run_id)
    if budgets.get("max_budget_ms") == float("inf"):
        assert after.status == "running" and ledger(threads, handle.run_id)["check_at"] is None
    else:
        assert (after.status, after.reason) == ("interrupted", "budget-exceeded")
    gate.opened.set()


@pytest.mark.parametrize("field", ["max_budget_ms", "no_progress_budget_ms"])
@pytest.mark.parametrize("value", [-1, -0.5, float("nan"), "60s", True])
def test_a_negative_or_non_numeric_budget_is_a_config_error_at_dispatch(
    threads: Threads, field: str, value: Any
) -> None:
    parent_thread = idle_parent(threads, RecordingParent(unique("parent")))
    child = quick_child()
    with pytest.raises(ConfigError, match=field):
        threads.run_agent_tool(parent_thread, child, input="x", detached=Detached(**{field: value}))
    assert threads.agent_tool_runs(parent_thread) == []


def test_a_run_cleared_while_its_finish_is_delivered_ends_the_delivery_cleanly(
    threads: Threads, finished_tasks: list[tuple[str, tuple[Any, ...], Any]]
) -> None:
    parent = BlockingParent(unique("cleared"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_slow"))
    assert parent.inside.wait(WAIT_S), "the worker never started delivering"
    try:
        assert threads.clear_agent_tool_runs(parent_thread) == 1
    finally:
        parent.release.set()
    # The row went while on_finish ran: the delivery used to fail on it (an AttributeError on
    # None) and leave its outbox row for the backbone to publish again.
    deliveries = eventually(
        lambda: [r for name, args, r in finished_tasks if name == "threads.deliver" and args[0] == handle.run_id],
        what="the delivery task to finish",
    )
    assert deliveries == ["skipped: the agent-tool run was cleared during its delivery"]
    assert not [k for k in outbox_keys(threads) if k.startswith(f"deliver:{handle.run_id}:")]
