"""Agents as tools on the embedded runtime (SQLite + the in-process worker, no services).

Covers the result envelope, model-called agent tools, idempotency by run id, the concurrency
cap, lifecycle events, detached runs (handle, on_finish, notify), cancellation, inspection,
the parent's registry and bad input. Finish delivery and budgets are in
``test_agent_tool_delivery.py``; progress and milestones in ``test_progress.py``.

One embedded runtime serves the module; each test defines agents under names of its own and
works on threads of its own. Child tools that must hold still block on a ``threading.Event``
(:class:`Gate`), which every test opens before it ends.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.agent_tool_agents import (
    Gate,
    RecordingParent,
    agent_tool_events,
    delivered,
    eventually,
    gated_child,
    idle_parent,
    quick_child,
    runs_of,
    unique,
)
from threads_celery import Agent, ConfigError, Detached, Threads, agent_tool
from threads_celery.definitions.agent_tools import DetachedHandle
from threads_celery.exceptions import UnknownAgent
from threads_celery.records import AgentToolFailure, AgentToolResult, AgentToolRun
from threads_celery.testing import ScriptedModel, call, say

# Four worker threads: a test may hold one or two in a gate while delivery still runs.
pytestmark = pytest.mark.embedded(concurrency=4)

WAIT_S = 30.0


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.opened.set()  # never leave a worker thread blocked after a test


Parent = RecordingParent


class CappedParent(RecordingParent):
    max_concurrent_agent_tools = 1


class SilentParent(RecordingParent):
    def format_detached_completion(self, run: AgentToolRun, result: Any) -> str:
        return ""


# -- the result envelope ---------------------------------------------------------------------


def test_a_completed_child_without_structured_output_returns_its_summary(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    result = threads.run_agent_tool(parent_thread, quick_child("the summary"), input="work", timeout=WAIT_S)
    assert isinstance(result, AgentToolResult)
    assert (result.ok, result.status, result.summary, result.output) == (True, "completed", "the summary", None)

    empty = threads.run_agent_tool(parent_thread, quick_child(""), input="work", timeout=WAIT_S)
    assert isinstance(empty, AgentToolResult)
    assert (empty.status, empty.summary, empty.output) == ("completed", "", None)


class Extractor(Agent):
    """A child with structured output: ``{"rows": 3}`` for run ids starting with "rows"."""

    def get_agent_tool_output(self, run_id: str) -> Any:
        return {"rows": 3, "run": run_id} if run_id.startswith("rows") else None

    def get_agent_tool_summary(self, run_id: str, output: Any) -> str:
        return f"extracted {output['rows']} rows"


def test_a_child_with_get_agent_tool_output_returns_the_output_and_its_summary(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = Extractor(name=unique("extractor"), instructions="", model=ScriptedModel([say("assistant text")]))
    run_id = unique("rows")
    result = threads.run_agent_tool(parent_thread, child, input="extract", run_id=run_id, timeout=WAIT_S)
    assert isinstance(result, AgentToolResult)
    assert result.output == {"rows": 3, "run": run_id}
    assert result.summary == "extracted 3 rows"
    row = threads.inspect_agent_tool_run(run_id)
    assert row is not None and (row.status, row.output, row.summary) == ("completed", result.output, "extracted 3 rows")


def test_a_completed_child_without_its_structured_output_is_a_non_retryable_error(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = Extractor(name=unique("extractor"), instructions="", model=ScriptedModel([say("no rows stored")]))
    result = threads.run_agent_tool(parent_thread, child, input="extract", run_id=unique("none"), timeout=WAIT_S)
    assert isinstance(result, AgentToolFailure)
    envelope = result.to_json()
    assert envelope == {"ok": False, "status": "error", "error": envelope["error"], "retryable": False}
    assert envelope["error"]


def test_failure_envelopes_are_retryable_only_when_interrupted() -> None:
    base = AgentToolRun(run_id="r", parent_thread_id="t", agent_type="A", status="running")
    assert base.result() is None  # still going

    error = AgentToolRun(**{**_fields(base), "status": "error"}).result()
    aborted = AgentToolRun(**{**_fields(base), "status": "aborted"}).result()
    interrupted = AgentToolRun(
        **{**_fields(base), "status": "interrupted", "reason": "no-progress", "child_still_running": True}
    ).result()
    assert isinstance(error, AgentToolFailure) and isinstance(aborted, AgentToolFailure)
    assert error.to_json() == {"ok": False, "status": "error", "error": "agent tool run failed", "retryable": False}
    assert aborted.to_json() == {
        "ok": False,
        "status": "aborted",
        "error": "agent tool run was cancelled",
        "retryable": False,
    }
    assert isinstance(interrupted, AgentToolFailure)
    assert interrupted.to_json() == {
        "ok": False,
        "status": "interrupted",
        "error": "agent tool run was interrupted",
        "retryable": True,
        "reason": "no-progress",
        "child_still_running": True,
    }
    # reason and child_still_running appear only where they are set.
    torn_down = AgentToolFailure(
        "interrupted", "gone", retryable=True, reason="window-exceeded", child_still_running=False
    )
    assert torn_down.to_json()["child_still_running"] is False
    assert "reason" not in AgentToolFailure("interrupted", "?", retryable=True).to_json()


def _fields(row: AgentToolRun) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__dataclass_fields__}


def test_a_failing_child_returns_a_non_retryable_error(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    broken = Agent(name=unique("broken_child"), instructions="", model=ScriptedModel([]))  # no turn to play
    result = threads.run_agent_tool(parent_thread, broken, input="work", timeout=WAIT_S)
    assert isinstance(result, AgentToolFailure)
    assert (result.status, result.retryable) == ("error", False)
    assert "reason" not in result.to_json() and "child_still_running" not in result.to_json()


# -- model-called agent tools ----------------------------------------------------------------


def test_a_model_called_agent_tool_waits_holding_no_worker_then_its_result_is_the_tool_message(
    threads: Threads, gate: Gate
) -> None:
    child = gated_child(gate, "researched it")
    parent = Parent(
        unique("parent"),
        tools=[agent_tool(child, "Research.", name="research", display_name="Researcher")],
        script=[call("research", message="HTTP/3"), say("parent done")],
    )
    handle = threads.start(parent, "go")
    gate.wait_inside()
    run = threads.get_run(handle.run_id)
    assert run.status == "waiting"
    assert run.lease_owner is None  # no worker holds the parent while the child works

    gate.opened.set()
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    messages = threads.messages(handle.thread_id)
    [assistant_call] = [m for m in messages if m.role == "assistant" and m.tool_calls]
    [tool_message] = [m for m in messages if m.role == "tool"]
    assert tool_message.tool_result is not None
    assert (tool_message.tool_result.content, tool_message.tool_result.is_error) == ("researched it", False)
    assert messages[-1].text == "parent done"
    [row] = threads.agent_tool_runs(handle.thread_id)
    tool_call = assistant_call.tool_calls[0]
    assert row.run_id == f"agent-tool:{tool_call.effect_key}"
    assert (row.parent_tool_call_id, row.display_name, row.status) == (tool_call.id, "Researcher", "completed")


def test_redelivering_the_parent_tool_task_never_starts_a_second_child(threads: Threads, gate: Gate) -> None:
    child = gated_child(gate)
    parent = Parent(
        unique("parent"),
        tools=[agent_tool(child, "Delegate.", name="delegate")],
        script=[call("delegate", message="x"), say("done")],
    )
    handle = threads.start(parent, "go")
    gate.wait_inside()
    runtime = threads.app.threads_runtime.get()
    [row] = threads.agent_tool_runs(handle.thread_id)
    effect_key = row.parent_effect_key
    assert effect_key is not None and row.run_id == f"agent-tool:{effect_key}"

    assert runtime.run_tool(effect_key).startswith("skipped")  # the broker delivered it again
    gate.opened.set()
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert runtime.run_tool(effect_key).startswith("skipped")
    # Dispatching the derived run id again re-attaches: the retained result, no new child.
    again = threads.run_agent_tool(handle.thread_id, child, input={"message": "x"}, run_id=row.run_id, timeout=WAIT_S)
    assert isinstance(again, AgentToolResult) and again.summary == "child done"

    assert len(threads.agent_tool_runs(handle.thread_id)) == 1
    assert len(runs_of(threads, child)) == 1
    assert gate.calls == 1
    assert [m.role for m in threads.messages(handle.thread_id)].count("tool") == 1


# -- idempotency by run id -------------------------------------------------------------------


def test_a_completed_run_id_run_again_with_other_input_returns_the_retained_result(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child("first answer")
    run_id = unique("same")
    first = threads.run_agent_tool(parent_thread, child, input="first input", run_id=run_id, timeout=WAIT_S)
    second = threads.run_agent_tool(parent_thread, child, input="other input", run_id=run_id, timeout=WAIT_S)
    assert isinstance(first, AgentToolResult) and isinstance(second, AgentToolResult)
    assert second.summary == first.summary == "first answer"

    [run] = runs_of(threads, child)
    user_messages = [m.text for m in threads.messages(run.thread_id) if m.role == "user"]
    assert user_messages == ["first input"]  # the child got no second message
    assert [r.run_id for r in threads.agent_tool_runs(parent_thread)] == [run_id]
    started = [p for t, p in agent_tool_events(threads, parent_thread, run_id) if t == "agent_tool.started"]
    assert len(started) == 1


def test_fan_out_runs_at_once_carry_the_parent_tool_call_id_and_display_order(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child("fanned out")
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(
                threads.run_agent_tool,
                parent_thread,
                child,
                input={"query": query},
                run_id=unique(f"fan_{order}"),
                parent_tool_call_id="call_fan",
                display_order=order,
                timeout=WAIT_S,
            )
            for order, query in enumerate(["HTTP/3", "gRPC"])
        ]
        results = [f.result() for f in futures]
    assert all(isinstance(r, AgentToolResult) and r.summary == "fanned out" for r in results)
    rows = sorted(threads.agent_tool_runs(parent_thread), key=lambda r: r.display_order)
    assert [(r.parent_tool_call_id, r.display_order, r.status) for r in rows] == [
        ("call_fan", 0, "completed"),
        ("call_fan", 1, "completed"),
    ]
    assert len({r.child_thread_id for r in rows}) == 2
    started = {p["run_id"]: p for t, p in agent_tool_events(threads, parent_thread) if t == "agent_tool.started"}
    assert {started[r.run_id]["order"] for r in rows} == {0, 1}
    assert json.loads(started[rows[1].run_id]["input_preview"]) == {"query": "gRPC"}


# -- the concurrency cap ---------------------------------------------------------------------


def test_past_the_cap_a_launch_fails_fast_naming_the_cap_and_starts_no_child(threads: Threads, gate: Gate) -> None:
    parent = CappedParent(unique("capped"))
    parent_thread = idle_parent(threads, parent)
    child = gated_child(gate)
    first = threads.run_agent_tool(parent_thread, child, input="one", detached=True)
    assert isinstance(first, DetachedHandle) and first.status == "running"
    gate.wait_inside()

    refused_id = unique("refused")
    refused = threads.run_agent_tool(parent_thread, child, input="two", run_id=refused_id, timeout=WAIT_S)
    assert isinstance(refused, AgentToolFailure)
    assert (refused.status, refused.retryable) == ("error", False)
    assert "max_concurrent_agent_tools" in refused.error and "1" in refused.error
    row = threads.inspect_agent_tool_run(refused_id)
    assert row is not None and row.status == "error" and row.child_thread_id is None and row.child_run_id is None
    assert [t for t, _ in agent_tool_events(threads, parent_thread, refused_id)] == [
        "agent_tool.started",
        "agent_tool.error",
    ]
    assert len(runs_of(threads, child)) == 1  # only the first child ever started

    detached_refusal = threads.run_agent_tool(parent_thread, child, input="three", detached=True)
    assert isinstance(detached_refusal, DetachedHandle)
    assert detached_refusal.status == "error" and "max_concurrent_agent_tools" in (detached_refusal.error or "")
    gate.opened.set()
    eventually(lambda: delivered(threads, first.run_id, "completed"), what="the first run's delivery")
    assert len(runs_of(threads, child)) == 1
    assert parent.finishes == [(first.run_id, "completed")]  # a refused run fires no finish hook


def test_two_launches_at_once_past_a_cap_of_one_refuse_exactly_one(threads: Threads, gate: Gate) -> None:
    parent_thread = idle_parent(threads, CappedParent(unique("capped")))
    child = gated_child(gate)
    with ThreadPoolExecutor(2) as pool:
        handles = list(
            pool.map(lambda i: threads.run_agent_tool(parent_thread, child, input=f"n{i}", detached=True), range(2))
        )
    assert sorted(h.status for h in handles) == ["error", "running"]
    gate.opened.set()


def test_the_cap_counts_running_children_of_every_agent_type(threads: Threads, gate: Gate) -> None:
    parent_thread = idle_parent(threads, CappedParent(unique("capped")))
    first = threads.run_agent_tool(parent_thread, gated_child(gate), input="one", detached=True)
    assert isinstance(first, DetachedHandle) and first.status == "running"
    other = quick_child()
    refused = threads.run_agent_tool(parent_thread, other, input="two", timeout=WAIT_S)
    assert isinstance(refused, AgentToolFailure) and "max_concurrent_agent_tools" in refused.error
    assert runs_of(threads, other) == []
    gate.opened.set()


def test_interrupted_runs_do_not_count_toward_the_cap(threads: Threads, gate: Gate) -> None:
    from threads_celery.transitions import agent_tools, runs

    parent_thread = idle_parent(threads, CappedParent(unique("capped")))
    first = threads.run_agent_tool(parent_thread, gated_child(gate), input="one", detached=True)
    gate.wait_inside()
    with threads.store.transaction() as tx:
        row = tx.get_agent_tool_run(first.run_id, lock=True)
        threads.publisher(
            agent_tools.seal_interrupted(
                tx, row, reason="no-progress", error="silent", child_still_running=True, now=runs.utcnow()
            )
        )
    second = threads.run_agent_tool(parent_thread, quick_child("second ran"), input="two", timeout=WAIT_S)
    assert isinstance(second, AgentToolResult) and second.summary == "second ran"
    gate.opened.set()


def test_a_model_called_agent_tool_past_the_cap_gets_the_cap_error_as_its_result(threads: Threads, gate: Gate) -> None:
    child = quick_child()

    def first_turn(messages: list[Any]) -> Any:
        # "hello" (idle_parent) gets a plain answer; "delegate now" calls the agent tool.
        return call("delegate", message="x") if "delegate now" in str(messages[-1]) else say("idle")

    parent = CappedParent(
        unique("capped"),
        tools=[agent_tool(child, "Delegate.", name="delegate")],
        script=[first_turn, say("saw the refusal")],
    )
    parent_thread = idle_parent(threads, parent)
    busy = threads.run_agent_tool(parent_thread, gated_child(gate), input="hold the slot", detached=True)
    assert busy.status == "running"
    # The parent's model calls the agent tool while the slot is taken.
    handle = threads.start(parent, "delegate now", thread_id=parent_thread)
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [tool_message] = [m for m in threads.messages(handle.thread_id) if m.role == "tool"]
    assert tool_message.tool_result is not None and tool_message.tool_result.is_error
    assert json.loads(tool_message.text)["status"] == "error"
    assert "max_concurrent_agent_tools" in tool_message.text
    assert runs_of(threads, child) == []
    gate.opened.set()


# -- lifecycle events ------------------------------------------------------------------------


def test_lifecycle_events_started_chunks_and_one_terminal_event(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    open_gate = Gate("noop_tool")
    open_gate.opened.set()
    child = Agent(
        name=unique("chatty_child"),
        instructions="",
        model=ScriptedModel([call("noop_tool"), say("final words")]),
        tools=[open_gate.tool()],
    )
    run_id = unique("events")
    long_input = "x" * 800
    result = threads.run_agent_tool(
        parent_thread, child, input=long_input, run_id=run_id, display_order=3, display_name="Chatty", timeout=WAIT_S
    )
    assert isinstance(result, AgentToolResult) and result.summary == "final words"

    events = agent_tool_events(threads, parent_thread, run_id)
    kinds = [t for t, _ in events]
    assert kinds[0] == "agent_tool.started"
    started = events[0][1]
    assert started["input_preview"] == "x" * 500
    assert (started["run_id"], started["agent_type"], started["order"], started["display"]) == (
        run_id,
        child.name,
        3,
        "Chatty",
    )
    terminal = [
        k
        for k in kinds
        if k in ("agent_tool.finished", "agent_tool.error", "agent_tool.aborted", "agent_tool.interrupted")
    ]
    assert terminal == ["agent_tool.finished"] and kinds[-1] == "agent_tool.finished"
    assert events[-1][1] == {"run_id": run_id, "summary": "final words"}
    chunks = [p["body"] for t, p in events if t == "agent_tool.chunk"]
    assert [c["role"] for c in chunks] == ["assistant", "tool", "assistant"]
    assert chunks[-1]["text"] == "final words"

    dict_run = unique("dict_input")
    threads.run_agent_tool(parent_thread, quick_child(), input={"query": "q" * 600}, run_id=dict_run, timeout=WAIT_S)
    [dict_started] = [p for t, p in agent_tool_events(threads, parent_thread, dict_run) if t == "agent_tool.started"]
    assert len(dict_started["input_preview"]) == 500 and dict_started["input_preview"].startswith('{"query": "qqq')


def test_terminal_event_delivery_forwards_no_child_chunks_but_progress_and_milestones(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    reporting = Gate(
        "report_then_go", before=lambda ctx: (ctx.report_progress(fraction=0.5), ctx.report_progress(milestone="half"))
    )
    reporting.opened.set()
    child = gated_child(reporting, "quiet")
    run_id = unique("terminal")
    result = threads.run_agent_tool(
        parent_thread, child, input="work", run_id=run_id, event_delivery="terminal", timeout=WAIT_S
    )
    assert isinstance(result, AgentToolResult) and result.summary == "quiet"
    assert [t for t, _ in agent_tool_events(threads, parent_thread, run_id)] == [
        "agent_tool.started",
        "agent_tool.progress",
        "agent_tool.milestone",
        "agent_tool.finished",
    ]
    row = threads.inspect_agent_tool_run(run_id)
    assert row is not None and row.child_thread_id is not None
    # The child still stores its whole conversation.
    assert [m.role for m in threads.messages(row.child_thread_id)] == ["user", "assistant", "tool", "assistant"]


def test_terminal_event_delivery_with_a_detached_run_is_a_config_error_and_starts_nothing(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child()
    with pytest.raises(ConfigError, match="terminal"):
        threads.run_agent_tool(parent_thread, child, input="work", detached=True, event_delivery="terminal")
    assert threads.agent_tool_runs(parent_thread) == []
    assert runs_of(threads, child) == []


# -- detached runs ---------------------------------------------------------------------------


def test_a_detached_run_returns_a_running_handle_at_once(threads: Threads, gate: Gate) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    child = gated_child(gate)
    handle = threads.run_agent_tool(parent_thread, child, input="long job", detached=Detached(on_finish="on_done"))
    assert isinstance(handle, DetachedHandle)
    assert (handle.agent_type, handle.status) == (child.name, "running")
    row = threads.inspect_agent_tool_run(handle.run_id)
    assert row is not None and row.status == "running" and row.detached  # the child has not finished
    gate.opened.set()
    eventually(lambda: parent.done, what="on_finish")
    [(run_id, result)] = parent.done
    assert run_id == handle.run_id and isinstance(result, AgentToolResult) and result.summary == "child done"


def test_on_finish_that_is_not_a_method_of_the_parent_is_a_config_error_at_dispatch(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child()
    for bad in ("no_such_method", "name"):  # missing, and an attribute that is not callable
        with pytest.raises(ConfigError, match="on_finish"):
            threads.run_agent_tool(parent_thread, child, input="x", detached=Detached(on_finish=bad))
    assert threads.agent_tool_runs(parent_thread) == []
    assert runs_of(threads, child) == []


def test_notify_injects_one_message_and_gives_the_parent_exactly_one_turn(threads: Threads) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    turns_before = parent.turns.turns
    child = quick_child("background result")
    handle = threads.run_agent_tool(parent_thread, child, input="research", detached=Detached(notify=True))
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the notify delivery")
    notify_run = threads.wait(f"notify:{handle.run_id}:completed", WAIT_S)
    assert notify_run.status == "completed"

    # A second delivery of the same finish changes nothing.
    runtime = threads.app.threads_runtime.get()
    assert runtime.deliver(handle.run_id, "completed").startswith("skipped")
    key = f"detached-finish:{handle.run_id}:completed"
    injected = [m for m in threads.messages(parent_thread) if m.key == key]
    assert len(injected) == 1
    [message] = injected
    assert message.role == "user" and "background result" in message.text
    assert message.meta == {
        "source": "detached-agent-tool",
        "run_id": handle.run_id,
        "agent_type": child.name,
        "status": "completed",
    }
    assert parent.turns.turns - turns_before == 1
    assert threads.messages(parent_thread)[-1].text == "ack"


def test_notify_with_a_source_of_its_own(threads: Threads) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(
        parent_thread, quick_child(), input="x", detached=Detached(notify={"source": "research-background"})
    )
    threads.wait(eventually(lambda: _notify_run_id(threads, parent_thread)), WAIT_S)
    [message] = [m for m in threads.messages(parent_thread) if m.key == f"detached-finish:{handle.run_id}:completed"]
    assert message.meta is not None and message.meta["source"] == "research-background"


def _notify_run_id(threads: Threads, thread_id: str) -> str | None:
    found = [r.id for r in threads.runs(thread_id=thread_id) if r.id.startswith("notify:")]
    return found[0] if found else None


def test_format_detached_completion_returning_empty_suppresses_the_notification(threads: Threads) -> None:
    parent = SilentParent(unique("silent"))
    parent_thread = idle_parent(threads, parent)
    turns_before = parent.turns.turns
    handle = threads.run_agent_tool(parent_thread, quick_child(), input="x", detached=Detached(notify=True))
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the delivery")
    assert not any((m.key or "").startswith("detached-finish:") for m in threads.messages(parent_thread))
    assert _notify_run_id(threads, parent_thread) is None
    assert parent.turns.turns == turns_before


def test_an_explicit_on_finish_wins_over_notify(threads: Threads) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(
        parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_done", notify=True)
    )
    eventually(lambda: delivered(threads, handle.run_id, "completed"), what="the delivery")
    assert [run_id for run_id, _ in parent.done] == [handle.run_id]
    assert not any((m.key or "").startswith("detached-finish:") for m in threads.messages(parent_thread))
    assert _notify_run_id(threads, parent_thread) is None


def test_a_signal_passed_to_a_detached_run_is_ignored_with_a_warning(threads: Threads) -> None:
    import threading

    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    signal = threading.Event()
    signal.set()  # already "aborted": a detached run must not inherit it
    with pytest.warns(RuntimeWarning, match="signal"):
        handle = threads.run_agent_tool(
            parent_thread, quick_child(), input="x", detached=Detached(on_finish="on_done"), signal=signal
        )
    assert handle.status == "running"
    eventually(lambda: parent.done, what="on_finish")
    assert parent.done[0][1].status == "completed"


# -- cancellation ----------------------------------------------------------------------------


def test_cancel_agent_tool_cancels_the_child_delivers_aborted_once_and_emits_one_event(
    threads: Threads, gate: Gate
) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    child = gated_child(gate)
    handle = threads.run_agent_tool(parent_thread, child, input="x", detached=Detached(on_finish="on_done"))
    gate.wait_inside()
    row = threads.cancel_agent_tool(handle.run_id)
    assert row is not None and row.status == "aborted"
    assert threads.get_run(row.child_run_id).status == "aborted"
    eventually(lambda: delivered(threads, handle.run_id, "aborted"), what="the aborted delivery")
    threads.cancel_agent_tool(handle.run_id)  # again: a no-op
    runtime = threads.app.threads_runtime.get()
    assert runtime.deliver(handle.run_id, "aborted").startswith("skipped")
    assert [(r, res.status) for r, res in parent.done] == [(handle.run_id, "aborted")]
    assert parent.finishes == [(handle.run_id, "aborted")]
    aborted_events = [
        p for t, p in agent_tool_events(threads, parent_thread, handle.run_id) if t == "agent_tool.aborted"
    ]
    assert aborted_events == [{"run_id": handle.run_id, "reason": "agent tool run was cancelled"}]


def test_cancelling_an_unknown_or_hard_terminal_run_is_a_no_op(threads: Threads) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    assert threads.cancel_agent_tool(unique("never_started")) is None
    run_id = unique("finished")
    threads.run_agent_tool(parent_thread, quick_child(), input="x", run_id=run_id, timeout=WAIT_S)
    eventually(lambda: delivered(threads, run_id, "completed"), what="the delivery")
    events_before = agent_tool_events(threads, parent_thread, run_id)
    row = threads.cancel_agent_tool(run_id)
    assert row is not None and row.status == "completed"
    assert agent_tool_events(threads, parent_thread, run_id) == events_before
    assert parent.finishes == [(run_id, "completed")]


def test_a_softly_interrupted_run_can_be_cancelled(threads: Threads, gate: Gate) -> None:
    from threads_celery.transitions import agent_tools, runs

    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    handle = threads.run_agent_tool(parent_thread, gated_child(gate), input="x", detached=Detached(on_finish="on_done"))
    gate.wait_inside()
    with threads.store.transaction() as tx:
        row = tx.get_agent_tool_run(handle.run_id, lock=True)
        entries = agent_tools.seal_interrupted(
            tx, row, reason="no-progress", error="silent", child_still_running=True, now=runs.utcnow()
        )
    threads.publisher(entries)
    eventually(lambda: delivered(threads, handle.run_id, "interrupted"), what="the interrupted delivery")

    row = threads.cancel_agent_tool(handle.run_id)
    assert row is not None and row.status == "aborted"
    assert threads.get_run(row.child_run_id).status == "aborted"
    eventually(lambda: delivered(threads, handle.run_id, "aborted"), what="the aborted delivery")
    assert [res.status for _, res in parent.done] == ["interrupted", "aborted"]


# -- inspection, the registry, clearing ------------------------------------------------------


def test_inspect_agent_tool_run_is_none_for_an_unknown_id_and_a_snapshot_otherwise(
    threads: Threads, gate: Gate
) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    assert threads.inspect_agent_tool_run(unique("no_record_yet")) is None

    def report(ctx: Any) -> None:
        ctx.report_progress(fraction=0.5, phase="ingesting", message="half way")
        ctx.report_progress(milestone="sources-gathered", data={"sources": 2})

    gate.before = report
    handle = threads.run_agent_tool(parent_thread, gated_child(gate), input="x", detached=True)
    gate.wait_inside()
    row = threads.inspect_agent_tool_run(handle.run_id)
    assert row is not None and row.status == "running"
    assert row.progress == {"fraction": 0.5, "phase": "ingesting", "message": "half way"}
    assert [(m.sequence, m.name, m.data) for m in row.milestones] == [(0, "sources-gathered", {"sources": 2})]
    gate.opened.set()


def test_has_agent_tool_run_only_when_parent_thread_agent_and_run_id_all_match(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    other_thread = idle_parent(threads, Parent(unique("parent")))
    child, other_child = quick_child(), quick_child()
    run_id = unique("known")
    threads.run_agent_tool(parent_thread, child, input="x", run_id=run_id, timeout=WAIT_S)
    assert threads.has_agent_tool_run(parent_thread, child, run_id)
    assert threads.has_agent_tool_run(parent_thread, child.name, run_id)
    assert not threads.has_agent_tool_run(other_thread, child, run_id)
    assert not threads.has_agent_tool_run(parent_thread, other_child, run_id)
    assert not threads.has_agent_tool_run(parent_thread, child, unique("guessed"))


def test_clear_agent_tool_runs_filters_on_status_and_start_time_and_cancels_running_children(
    threads: Threads, gate: Gate
) -> None:
    from threads_celery.transitions import runs

    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child()
    done_id = unique("done")
    threads.run_agent_tool(parent_thread, child, input="x", run_id=done_id, timeout=WAIT_S)
    cutoff = runs.utcnow()
    eventually(lambda: runs.utcnow() > cutoff, what="the clock to move")
    running = threads.run_agent_tool(parent_thread, gated_child(gate), input="y", detached=True)
    gate.wait_inside()
    running_row = threads.inspect_agent_tool_run(running.run_id)
    assert running_row is not None

    # Nothing finished before the run that is done started.
    first_start = threads.inspect_agent_tool_run(done_id).started_at
    assert threads.clear_agent_tool_runs(parent_thread, older_than=first_start) == 0
    # A status filter that matches nothing leaves the running child alone.
    assert threads.clear_agent_tool_runs(parent_thread, status=["error"]) == 0
    assert threads.get_run(running_row.child_run_id).status == "running"
    # older_than: only the run that started before the cutoff.
    assert threads.clear_agent_tool_runs(parent_thread, older_than=cutoff) == 1
    assert threads.inspect_agent_tool_run(done_id) is None
    assert [r.run_id for r in threads.agent_tool_runs(parent_thread)] == [running.run_id]

    assert [r.run_id for r in threads.agent_tool_runs(parent_thread, status="running")] == [running.run_id]
    assert threads.clear_agent_tool_runs(parent_thread, status="running") == 1  # one status as a string
    assert threads.agent_tool_runs(parent_thread) == []
    aborted = [p for t, p in agent_tool_events(threads, parent_thread, running.run_id) if t == "agent_tool.aborted"]
    assert aborted == [{"run_id": running.run_id, "reason": "clearing agent tool run"}]
    # The child's thread went with its row.
    assert threads.messages(running_row.child_thread_id) == []
    assert threads.has_agent_tool_run(parent_thread, running_row.agent_type, running.run_id) is False


# -- re-attaching ----------------------------------------------------------------------------


def test_running_an_interrupted_run_id_again_reattaches_and_collects_the_completion(
    threads: Threads, gate: Gate
) -> None:
    from threads_celery.transitions import agent_tools, runs

    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = gated_child(gate, "finished after all")
    run_id = unique("reattach")
    first = threads.run_agent_tool(parent_thread, child, input="x", run_id=run_id, detached=True)
    gate.wait_inside()
    with threads.store.transaction() as tx:
        row = tx.get_agent_tool_run(run_id, lock=True)
        threads.publisher(
            agent_tools.seal_interrupted(
                tx, row, reason="no-progress", error="silent", child_still_running=True, now=runs.utcnow()
            )
        )
    assert threads.inspect_agent_tool_run(run_id).status == "interrupted"
    with ThreadPoolExecutor(1) as pool:
        again = pool.submit(threads.run_agent_tool, parent_thread, child, input="x", run_id=run_id, timeout=WAIT_S)
        eventually(lambda: threads.inspect_agent_tool_run(run_id).status == "running", what="the re-attach")
        gate.opened.set()
        result = again.result(WAIT_S)
    assert isinstance(result, AgentToolResult) and result.summary == "finished after all"
    row = threads.inspect_agent_tool_run(run_id)
    assert (row.status, row.reason, row.child_still_running) == ("completed", None, None)
    assert len(runs_of(threads, child)) == 1 and first.status == "running"


# -- bad input -------------------------------------------------------------------------------


def test_an_unknown_agent_type_is_a_clear_error_and_starts_no_child(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    with pytest.raises(UnknownAgent, match="no_such_agent"):
        threads.run_agent_tool(parent_thread, "no_such_agent", input="x")
    assert threads.agent_tool_runs(parent_thread) == []


def test_a_drill_in_check_for_a_run_id_the_parent_never_started_spawns_nothing(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child()
    threads.register(child)
    guessed = unique("guessed")
    assert threads.has_agent_tool_run(parent_thread, child, guessed) is False
    assert threads.inspect_agent_tool_run(guessed) is None
    assert threads.agent_tool_runs(parent_thread) == []
    assert runs_of(threads, child) == []


def test_bad_dispatch_options_are_config_errors(threads: Threads) -> None:
    parent_thread = idle_parent(threads, Parent(unique("parent")))
    child = quick_child()
    with pytest.raises(ConfigError, match="event_delivery"):
        threads.run_agent_tool(parent_thread, child, input="x", event_delivery="some")
    with pytest.raises(ConfigError):
        threads.run_agent_tool(parent_thread, child, input="x", detached={"notify": True})  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match="max_budget_ms"):
            threads.run_agent_tool(parent_thread, child, input="x", detached=Detached(max_budget_ms=-1))
    assert threads.agent_tool_runs(parent_thread) == []
    assert runs_of(threads, child) == []


# -- trees, neighbours and cancellation from above -------------------------------------------


def test_cancelling_the_spawning_run_cancels_its_awaited_child_with_the_reason(threads: Threads, gate: Gate) -> None:
    child = gated_child(gate)
    parent = Parent(
        unique("parent"),
        tools=[agent_tool(child, "Delegate.", name="delegate")],
        script=[call("delegate", message="x"), say("never")],
    )
    handle = threads.start(parent, "go")
    gate.wait_inside()
    [row] = threads.agent_tool_runs(handle.thread_id)
    assert threads.cancel(handle.run_id, reason="the user pressed stop").status == "aborted"
    child_run = eventually(
        lambda: (lambda r: r if r.is_terminal else None)(threads.get_run(row.child_run_id)), what="the child to stop"
    )
    assert (child_run.status, child_run.error) == ("aborted", "the user pressed stop")
    row = eventually(lambda: delivered(threads, row.run_id, "aborted"), what="the aborted delivery")
    assert row.result().to_json() == {
        "ok": False,
        "status": "aborted",
        "error": "the user pressed stop",
        "retryable": False,
    }
    assert [p for t, p in agent_tool_events(threads, handle.thread_id, row.run_id) if t == "agent_tool.aborted"] == [
        {"run_id": row.run_id, "reason": "the user pressed stop"}
    ]
    assert threads.get_run(handle.run_id).status == "aborted"
    assert not [m for m in threads.messages(handle.thread_id) if m.role == "tool"]


def test_cancelling_a_parent_run_leaves_detached_children_running(threads: Threads, gate: Gate) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    detached = threads.run_agent_tool(parent_thread, gated_child(gate), input="x", detached=True)
    gate.wait_inside()
    busy = threads.start(parent, "another turn", thread_id=parent_thread)
    threads.wait(busy.run_id, WAIT_S)
    threads.cancel(busy.run_id)
    assert threads.inspect_agent_tool_run(detached.run_id).status == "running"
    gate.opened.set()
    eventually(lambda: delivered(threads, detached.run_id, "completed"), what="the detached run to finish")


def test_nested_agent_tools_each_level_keeps_its_own_cap_and_events(threads: Threads) -> None:
    leaf = quick_child("leaf done")
    middle = CappedParent(
        unique("middle"),
        tools=[agent_tool(leaf, "Leaf.", name="leaf")],
        script=[call("leaf", message="deeper"), say("middle done")],
    )
    top = CappedParent(
        unique("top"),
        tools=[agent_tool(middle, "Middle.", name="middle")],
        script=[call("middle", message="down"), say("top done")],
    )
    handle = threads.start(top, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert [m.text for m in threads.messages(handle.thread_id) if m.role == "tool"] == ["middle done"]
    [middle_row] = threads.agent_tool_runs(handle.thread_id)
    [leaf_row] = threads.agent_tool_runs(middle_row.child_thread_id)
    assert (middle_row.agent_type, leaf_row.agent_type) == (middle.name, leaf.name)
    # The leaf's events stay on the middle's thread: grandchildren are not bridged up.
    assert {p["run_id"] for _, p in agent_tool_events(threads, handle.thread_id)} == {middle_row.run_id}
    assert {p["run_id"] for _, p in agent_tool_events(threads, middle_row.child_thread_id)} == {leaf_row.run_id}


def test_an_error_in_one_run_leaves_a_healthy_sibling_alone(threads: Threads, gate: Gate) -> None:
    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    healthy = threads.run_agent_tool(
        parent_thread, gated_child(gate, "healthy"), input="ok", detached=Detached(on_finish="on_done")
    )
    gate.wait_inside()
    broken = threads.run_agent_tool(
        parent_thread,
        Agent(name=unique("broken_child"), instructions="", model=ScriptedModel([])),
        input="boom",
        detached=Detached(on_finish="on_done"),
    )
    eventually(lambda: delivered(threads, broken.run_id, "error"), what="the broken run's delivery")
    assert threads.inspect_agent_tool_run(healthy.run_id).status == "running"
    assert threads.inspect_agent_tool_run(healthy.run_id).error is None
    gate.opened.set()
    eventually(lambda: delivered(threads, healthy.run_id, "completed"), what="the healthy run's delivery")
    outcomes = {run_id: result for run_id, result in parent.done}
    assert outcomes[healthy.run_id].status == "completed" and outcomes[healthy.run_id].summary == "healthy"
    assert outcomes[broken.run_id].status == "error"
    errors = [p["run_id"] for t, p in agent_tool_events(threads, parent_thread) if t == "agent_tool.error"]
    assert errors == [broken.run_id]


def test_a_detached_redispatch_of_an_interrupted_run_id_reattaches_and_rearms_the_backbone(
    threads: Threads, gate: Gate
) -> None:
    from datetime import timedelta

    from threads_celery.runtime.machine import Runtime
    from threads_celery.transitions import agent_tools, runs

    parent = Parent(unique("parent"))
    parent_thread = idle_parent(threads, parent)
    child = gated_child(gate, "came back")
    run_id = unique("rearm")
    options = Detached(on_finish="on_done", no_progress_budget_ms=1000)
    threads.run_agent_tool(parent_thread, child, input="x", run_id=run_id, detached=options)
    gate.wait_inside()
    with threads.store.transaction() as tx:
        row = tx.get_agent_tool_run(run_id, lock=True)
        threads.publisher(
            agent_tools.seal_interrupted(
                tx, row, reason="no-progress", error="silent", child_still_running=True, now=runs.utcnow()
            )
        )
    eventually(lambda: delivered(threads, run_id, "interrupted"), what="the give-up's delivery")

    again = threads.run_agent_tool(parent_thread, child, input="x", run_id=run_id, detached=options)
    assert isinstance(again, DetachedHandle) and (again.run_id, again.status) == (run_id, "running")
    row = threads.inspect_agent_tool_run(run_id)
    assert (row.status, row.reason, row.child_still_running) == ("running", None, None)
    assert len(runs_of(threads, child)) == 1  # re-attached, not spawned
    # Re-armed: the backbone looks at the run again and gives up after another silence ...
    clock = [row.last_signal_at + timedelta(seconds=5)]
    Runtime(threads.store, threads.registry, publish=threads.publisher, clock=lambda: clock[0]).reconcile_tick()
    assert threads.inspect_agent_tool_run(run_id).status == "interrupted"
    # ... which is not delivered a second time; the real completion still is.
    gate.opened.set()
    eventually(lambda: delivered(threads, run_id, "completed"), what="the completion's delivery")
    assert [res.status for _, res in parent.done] == ["interrupted", "completed"]


def test_cancelling_the_top_of_a_tree_cancels_awaited_grandchildren_too(threads: Threads, gate: Gate) -> None:
    leaf = gated_child(gate)
    middle = Parent(
        unique("middle"),
        tools=[agent_tool(leaf, "Leaf.", name="leaf")],
        script=[call("leaf", message="y"), say("never")],
    )
    top = Parent(
        unique("top"),
        tools=[agent_tool(middle, "Middle.", name="middle")],
        script=[call("middle", message="x"), say("never")],
    )
    handle = threads.start(top, "go")
    gate.wait_inside()
    [middle_row] = threads.agent_tool_runs(handle.thread_id)
    [leaf_row] = threads.agent_tool_runs(middle_row.child_thread_id)
    threads.cancel(handle.run_id, reason="stop everything")
    for row in (middle_row, leaf_row):
        run = threads.get_run(row.child_run_id)
        assert (run.status, run.error) == ("aborted", "stop everything")
        eventually(
            lambda row=row: delivered(threads, row.run_id, "aborted"), what=f"{row.agent_type}'s aborted delivery"
        )
