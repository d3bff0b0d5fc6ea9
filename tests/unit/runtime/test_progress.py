"""Progress and milestones reported from inside a child agent-tool run (embedded, no services).

A child reports through ``ctx.report_progress(...)``; the worker's
:class:`~threads_celery.runtime.progress.ProgressReporter` coalesces ephemeral progress (200 ms, latest
wins, ``fraction >= 1`` always goes out), keeps the latest snapshot on the agent-tool row, stores
milestones as durable rows with a per-run sequence, and surfaces configured milestones of
detached runs in the parent thread (narrate: an assistant line; react: a user turn).

Coalescing is tested on a reporter whose clock the test moves (the module's ``time`` is swapped
for a fake), against a real running child held in a gate.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.agent_tool_agents import (
    Gate,
    RecordingParent,
    agent_tool_events,
    eventually,
    gated_child,
    idle_parent,
    unique,
)
from threads_celery import Agent, Detached, Threads, tool
from threads_celery.definitions.context import ToolContext
from threads_celery.runtime import progress
from threads_celery.runtime.progress import ProgressReporter
from threads_celery.testing import ScriptedModel, call, say

pytestmark = pytest.mark.embedded(concurrency=4)

WAIT_S = 30.0


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.opened.set()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The progress module's monotonic clock, moved by the test (seconds)."""
    now = [1000.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def running_child(threads: Threads, gate: Gate, parent: RecordingParent, detached: Any = True) -> tuple[str, str]:
    """A child agent-tool run of a fresh parent thread, held running in the gate."""
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, gated_child(gate), input="x", detached=detached)
    gate.wait_inside()
    return parent_thread, handle.run_id


def reporter(threads: Threads) -> ProgressReporter:
    """A reporter of its own on the embedded runtime (fresh coalescing state)."""
    return ProgressReporter(threads.app.threads_runtime.get())


def progress_events(threads: Threads, parent_thread: str, run_id: str) -> list[dict[str, Any]]:
    return [p for t, p in agent_tool_events(threads, parent_thread, run_id) if t == "agent_tool.progress"]


# -- outside an agent-tool run ---------------------------------------------------------------


def test_report_progress_outside_an_agent_tool_run_is_inactive_and_warns_once() -> None:
    ctx = ToolContext(effect_key="k", run_id="r", thread_id="t", attempt=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ctx.report_progress(fraction=0.5, message="half") == "inactive"
        assert ctx.report_progress(milestone="m") == "inactive"
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [
        "report_progress() outside an agent-tool run does nothing"
    ]


def test_report_progress_in_a_run_that_is_no_agent_tool_run_stores_nothing(threads: Threads) -> None:
    answers: list[str] = []

    class NoInput(BaseModel):
        pass

    def work(inp: Any, ctx: Any) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            answers.append(ctx.report_progress(fraction=0.5, phase="working"))
            answers.append(ctx.report_progress(milestone="halfway", data={"n": 1}, persist=True))
        return "worked"

    agent = Agent(
        name=unique("standalone"),
        instructions="",
        model=ScriptedModel([call("work"), say("done")]),
        tools=[tool(name="work", description="Work.", input=NoInput, effect="read_only", execute=work)],
    )
    handle = threads.start(agent, "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert answers == ["inactive", "inactive"]
    assert agent_tool_events(threads, handle.thread_id) == []
    assert threads.agent_tool_runs(handle.thread_id) == []


def test_report_progress_after_the_run_ended_is_inactive_and_stores_nothing(threads: Threads, gate: Gate) -> None:
    parent_thread, run_id = running_child(threads, gate, RecordingParent(unique("parent")))
    gate.opened.set()
    eventually(lambda: threads.inspect_agent_tool_run(run_id).status == "completed", what="the child to finish")
    events_before = agent_tool_events(threads, parent_thread, run_id)
    assert reporter(threads).report(run_id, fraction=0.9, message="late") == "inactive"
    assert reporter(threads).report(run_id, milestone="late") == "inactive"
    row = threads.inspect_agent_tool_run(run_id)
    assert row.progress is None and row.milestones == ()
    assert agent_tool_events(threads, parent_thread, run_id) == events_before


# -- ephemeral progress ----------------------------------------------------------------------


def test_progress_reported_by_a_child_tool_reaches_the_row_the_events_and_on_progress(
    threads: Threads, gate: Gate
) -> None:
    parent = RecordingParent(unique("parent"))
    answers: list[str] = []
    gate.before = lambda ctx: answers.append(
        ctx.report_progress(fraction=0.6, phase="ingesting", message="40k/80k rows")
    )
    parent_thread, run_id = running_child(threads, gate, parent)
    assert answers == ["sent"]
    snapshot = {"fraction": 0.6, "phase": "ingesting", "message": "40k/80k rows"}
    assert threads.inspect_agent_tool_run(run_id).progress == snapshot
    assert progress_events(threads, parent_thread, run_id) == [{"run_id": run_id, **snapshot}]
    assert parent.progress == [(run_id, {**snapshot, "milestone": None, "data": None})]


def test_a_second_report_within_200_ms_is_coalesced_and_a_full_fraction_always_goes_out(
    threads: Threads, gate: Gate, clock: list[float]
) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread, run_id = running_child(threads, gate, parent)
    r = reporter(threads)
    assert r.report(run_id, fraction=0.1) == "sent"
    clock[0] += 0.05
    assert r.report(run_id, fraction=0.2) == "coalesced"
    clock[0] += 0.10
    assert r.report(run_id, fraction=0.3) == "coalesced"  # 150 ms after the last emit
    assert threads.inspect_agent_tool_run(run_id).progress == {"fraction": 0.1}
    assert r.report(run_id, fraction=1.0, message="done") == "sent"  # never held back
    clock[0] += 0.05
    assert r.report(run_id, fraction=1.0, message="done again") == "sent"
    clock[0] += 0.05
    assert r.report(run_id, fraction=0.4) == "coalesced"  # the clock restarted at the last emit
    clock[0] += 0.25
    assert r.report(run_id, fraction=0.5, phase="latest") == "sent"  # latest wins at the next emit
    assert threads.inspect_agent_tool_run(run_id).progress == {"fraction": 0.5, "phase": "latest"}
    fractions = [p["fraction"] for p in progress_events(threads, parent_thread, run_id)]
    assert fractions == [0.1, 1.0, 1.0, 0.5]
    assert [p["fraction"] for _, p in parent.progress] == fractions  # on_progress sees what went out


def test_coalescing_is_per_run(threads: Threads, gate: Gate, clock: list[float]) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    child = gated_child(gate)
    first = threads.run_agent_tool(parent_thread, child, input="a", detached=True)
    second = threads.run_agent_tool(parent_thread, child, input="b", detached=True)
    eventually(lambda: gate.calls == 2, what="both children to reach the gate")
    r = reporter(threads)
    assert r.report(first.run_id, fraction=0.1) == "sent"
    assert r.report(second.run_id, fraction=0.1) == "sent"
    assert r.report(first.run_id, fraction=0.2) == "coalesced"


def test_data_is_stored_only_with_persist_but_reaches_on_progress_live(
    threads: Threads, gate: Gate, clock: list[float]
) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread, run_id = running_child(threads, gate, parent)
    r = reporter(threads)
    assert r.report(run_id, fraction=0.2, data={"rows": 100}) == "sent"
    row = threads.inspect_agent_tool_run(run_id)
    assert row.progress == {"fraction": 0.2}
    assert progress_events(threads, parent_thread, run_id)[-1] == {"run_id": run_id, "fraction": 0.2}
    assert parent.progress[-1][1]["data"] == {"rows": 100}

    clock[0] += 1
    assert r.report(run_id, fraction=0.4, data={"rows": 200}, persist=True) == "sent"
    assert threads.inspect_agent_tool_run(run_id).progress == {"fraction": 0.4, "data": {"rows": 200}}
    assert progress_events(threads, parent_thread, run_id)[-1]["data"] == {"rows": 200}
    assert parent.progress[-1][1]["data"] == {"rows": 200}


def test_a_fraction_outside_0_to_1_is_rejected(threads: Threads, gate: Gate) -> None:
    _, run_id = running_child(threads, gate, RecordingParent(unique("parent")))
    with pytest.raises(ValueError, match="fraction"):
        reporter(threads).report(run_id, fraction=-0.1)
    assert threads.inspect_agent_tool_run(run_id).progress is None


# -- milestones ------------------------------------------------------------------------------


def test_milestones_are_never_coalesced_have_a_sequence_from_0_and_keep_the_snapshot(
    threads: Threads, gate: Gate, clock: list[float]
) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread, run_id = running_child(threads, gate, parent)
    r = reporter(threads)
    assert r.report(run_id, fraction=0.3, phase="gathering") == "sent"
    assert r.report(run_id, milestone="sources-gathered", data={"sources": 2}) == "sent"
    assert r.report(run_id, milestone="outline-ready") == "sent"
    assert r.report(run_id, milestone="sources-gathered", data={"sources": 3}) == "sent"
    # A milestone resets the coalescing clock: progress right after it is held back.
    assert r.report(run_id, fraction=0.35) == "coalesced"

    row = threads.inspect_agent_tool_run(run_id)
    assert row.progress == {"fraction": 0.3, "phase": "gathering"}  # not overwritten by milestones
    assert [(m.sequence, m.name, m.data) for m in row.milestones] == [
        (0, "sources-gathered", {"sources": 2}),
        (1, "outline-ready", None),
        (2, "sources-gathered", {"sources": 3}),
    ]
    milestone_events = [p for t, p in agent_tool_events(threads, parent_thread, run_id) if t == "agent_tool.milestone"]
    assert [(p["sequence"], p["name"]) for p in milestone_events] == [
        (0, "sources-gathered"),
        (1, "outline-ready"),
        (2, "sources-gathered"),
    ]
    # on_progress fires for progress and milestones alike, milestone set only on milestones.
    assert [p["milestone"] for _, p in parent.progress] == [
        None,
        "sources-gathered",
        "outline-ready",
        "sources-gathered",
    ]
    assert parent.progress[1][1]["data"] == {"sources": 2}


def test_milestone_sequences_are_per_run(threads: Threads, gate: Gate) -> None:
    parent_thread = idle_parent(threads, RecordingParent(unique("parent")))
    child = gated_child(gate)
    a = threads.run_agent_tool(parent_thread, child, input="a", detached=True)
    b = threads.run_agent_tool(parent_thread, child, input="b", detached=True)
    eventually(lambda: gate.calls == 2, what="both children to reach the gate")
    r = reporter(threads)
    r.report(a.run_id, milestone="one")
    r.report(a.run_id, milestone="two")
    r.report(b.run_id, milestone="one")
    assert [m.sequence for m in threads.inspect_agent_tool_run(a.run_id).milestones] == [0, 1]
    assert [m.sequence for m in threads.inspect_agent_tool_run(b.run_id).milestones] == [0]


def test_on_milestones_narrate_injects_one_assistant_line_and_calls_no_model(threads: Threads, gate: Gate) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread, run_id = running_child(threads, gate, parent, detached=Detached(on_milestones=["sources-gathered"]))
    turns_before = parent.turns.turns
    runs_before = {r.id for r in threads.runs(thread_id=parent_thread)}
    r = reporter(threads)
    r.report(run_id, milestone="sources-gathered", data={"sources": 2})
    r.report(run_id, milestone="not-configured")
    r.report(run_id, milestone="sources-gathered", data={"sources": 3})  # the same name again

    key = f"detached-ms:{run_id}:sources-gathered"
    injected = [m for m in threads.messages(parent_thread) if (m.key or "").startswith("detached-ms:")]
    assert [(m.key, m.role) for m in injected] == [(key, "assistant")]
    assert "sources-gathered" in injected[0].text
    assert injected[0].meta is not None and injected[0].meta["run_id"] == run_id and injected[0].meta["source"]
    assert parent.turns.turns == turns_before  # no model call
    # The line queued as a narration of its own (so it never splits the parent's turn).
    added = [r for r in threads.runs(thread_id=parent_thread) if r.id not in runs_before]
    assert [r.id for r in added] == [f"narrate:{run_id}:sources-gathered"]


def test_on_milestones_react_posts_a_user_turn_that_gets_exactly_one_reply(threads: Threads, gate: Gate) -> None:
    parent = RecordingParent(unique("parent"))
    options = Detached(on_milestones={"names": ["needs-approval"], "mode": "react"})
    parent_thread, run_id = running_child(threads, gate, parent, detached=options)
    turns_before = parent.turns.turns
    r = reporter(threads)
    r.report(run_id, milestone="needs-approval")
    r.report(run_id, milestone="needs-approval")  # each (run, name) at most once
    react_run = threads.wait(f"milestone:{run_id}:needs-approval", WAIT_S)
    assert react_run.status == "completed"

    key = f"detached-ms:{run_id}:needs-approval"
    messages = threads.messages(parent_thread)
    [turn] = [m for m in messages if m.key == key]
    assert turn.role == "user"
    replies = [m for m in messages if m.run_id == react_run.id and m.role == "assistant"]
    assert [m.text for m in replies] == ["ack"]
    assert parent.turns.turns - turns_before == 1
    assert [r.id for r in threads.runs(thread_id=parent_thread) if r.id.startswith("milestone:")] == [react_run.id]


class Narrator(RecordingParent):
    def format_detached_milestone(self, run: Any, milestone: dict[str, Any]) -> str:
        return (
            ""
            if milestone["name"] == "quiet"
            else f"{run.agent_type} reached {milestone['name']} ({milestone['data']})"
        )


def test_format_detached_milestone_words_the_line_or_suppresses_it(threads: Threads, gate: Gate) -> None:
    parent = Narrator(unique("narrator"))
    parent_thread, run_id = running_child(threads, gate, parent, detached=Detached(on_milestones=["loud", "quiet"]))
    r = reporter(threads)
    r.report(run_id, milestone="loud", data=1)
    r.report(run_id, milestone="quiet", data=2)
    injected = [m.text for m in threads.messages(parent_thread) if (m.key or "").startswith("detached-ms:")]
    row = threads.inspect_agent_tool_run(run_id)
    assert injected == [f"{row.agent_type} reached loud (1)"]
    assert [m.name for m in row.milestones] == ["loud", "quiet"]  # both stored all the same


def test_milestones_of_an_awaited_run_are_stored_but_not_narrated(threads: Threads, gate: Gate) -> None:
    parent = RecordingParent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    gate.before = lambda ctx: ctx.report_progress(milestone="halfway")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            threads.run_agent_tool,
            parent_thread,
            gated_child(gate),
            input="x",
            run_id=unique("awaited"),
            timeout=WAIT_S,
        )
        gate.wait_inside()
        gate.opened.set()
        result = pending.result(WAIT_S)
    row = threads.inspect_agent_tool_run(result.run_id)
    assert [m.name for m in row.milestones] == ["halfway"]
    assert not any((m.key or "").startswith("detached-ms:") for m in threads.messages(parent_thread))
