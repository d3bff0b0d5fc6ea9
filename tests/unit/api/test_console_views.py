"""The console's pure parts: the timeline's steps, the run tree and its kinds, why a run waits,
and the session cookie's checks (no runtime needed)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from threads_celery.api.console.session import csrf_ok, issue, verify
from threads_celery.api.console.views import child_kind, ended_because, run_tree, timeline
from threads_celery.api.tenancy import Caller
from threads_celery.records import AgentToolRun, CallTimelineEntry, Message, ModelTurn, Run

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(**fields: Any) -> Run:
    base = Run(id="run_1", thread_id="thread_1", agent="a", status="completed", step=2, fence=1, input="hi")
    return replace(base, started_at=at(0), **fields)


def call(step: int, index: int, *, finished: float | None) -> CallTimelineEntry:
    return CallTimelineEntry(
        effect_key=f"run_1:{step}:{index}",
        run_id="run_1",
        step=step,
        index=index,
        tool="t",
        args="{}",
        effect="read_only",
        status="completed",
        attempt=0,
        created_at=at(1),
        finished_at=at(finished) if finished is not None else None,
    )


def test_a_turn_starts_when_the_run_started_or_when_the_last_call_of_the_step_before_finished() -> None:
    turns = [
        ModelTurn("run_1", 0, "m", 1, 10, 5, None, at(1)),
        ModelTurn("run_1", 1, "m", 1, 20, 7, 0.002, at(9)),
    ]
    calls = [call(0, 0, finished=3), call(0, 1, finished=6)]
    replies = [
        Message("thread_1", 2, "assistant", "calling", run_id="run_1", created_at=at(1)),
        Message("thread_1", 5, "assistant", "done", run_id="run_1", created_at=at(9)),
    ]
    steps = timeline(run(), turns, calls, replies)
    assert [s.step for s in steps] == [0, 1]
    first, second = steps
    assert first.turn is not None and (first.turn.started_at, first.turn.ended_at, first.turn.text) == (
        at(0),
        at(1),
        "calling",
    )
    assert [c.index for c in first.calls] == [0, 1]
    assert second.turn is not None and (second.turn.started_at, second.turn.ended_at) == (at(6), at(9))
    assert second.turn.text == "done" and second.calls == ()


def test_a_step_whose_calls_are_not_finished_has_a_turn_of_unknown_start() -> None:
    steps = timeline(run(status="running"), [ModelTurn("run_1", 1, "m", 1, 1, 1)], [call(0, 0, finished=None)], [])
    assert steps[1].turn is not None and steps[1].turn.started_at is None


def row(run_id: str, parent_run: str, **fields: Any) -> AgentToolRun:
    base = AgentToolRun(run_id=run_id, parent_thread_id="thread_1", agent_type="child", status="running")
    return replace(
        base, parent_run_id=parent_run, child_thread_id=f"thread_of_{run_id}", child_run_id=f"run_of_{run_id}", **fields
    )


def test_the_tree_holds_agent_tools_subagents_and_detached_runs_and_their_own_children() -> None:
    rows = {
        "thread_1": [
            row("tool", "run_1"),
            row("sub", "run_1", display_name="subagent:researcher"),
            row("away", "run_1", detached=True),
            row("other", "run_2"),  # another run of the same thread
        ],
        "thread_of_tool": [row("grandchild", "run_of_tool", parent_thread_id="thread_of_tool")],
    }
    tree = run_tree(lambda thread: rows.get(thread, []), run())
    assert [(c.row.run_id, c.kind) for c in tree] == [
        ("tool", "agent tool"),
        ("sub", "subagent"),
        ("away", "detached"),
    ]
    assert [c.row.run_id for c in tree[0].children] == ["grandchild"]
    assert child_kind(row("x", "r", display_name="subagent:a", detached=True)) == "subagent"


def test_why_a_run_ended_or_waits() -> None:
    assert ended_because(run()) is None
    assert ended_because(run(status="error", error="model failed")) == "model failed"
    assert ended_because(run(status="awaiting_approval"), ["", "asks first"]) == "asks first"
    assert ended_because(run(status="running")) is None


def test_a_session_is_the_tokens_until_it_expires_and_its_csrf_token_is_its_own() -> None:
    callers = {"tok-a": Caller("alice", "acme"), "tok-b": Caller("bob", "globex")}
    cookie = issue("tok-a", now=1_000)
    session = verify(cookie, callers, lifetime_s=60, now=1_030)
    assert session is not None and session.caller == Caller("alice", "acme")
    assert verify(cookie, callers, lifetime_s=60, now=1_061) is None  # expired
    assert verify(cookie, {"tok-b": callers["tok-b"]}, lifetime_s=60, now=1_030) is None  # token removed
    assert verify(issue("tok-a", now=2_000), callers, lifetime_s=60, now=1_000) is None  # from the future
    other = verify(issue("tok-b", now=1_000), callers, lifetime_s=60, now=1_030)
    assert other is not None and csrf_ok(session, session.csrf) and not csrf_ok(session, other.csrf)
    assert not csrf_ok(session, None) and not csrf_ok(session, "")
