"""Concurrent read-only calls: ``tool(..., concurrent=True)``.

Pure planning first (which calls form a group, which wave is dispatched, what is shown when),
then definition errors, then runs on the embedded runtime (SQLite + in-process worker threads):
calls of a group overlap, results join the conversation and the event log in call order whatever
order they finish in, a call in order keeps its place, the in-flight limit holds, a call that
raises leaves its siblings alone, and a cancel lets running calls finish and skips the rest.
The crash case (a worker SIGKILLed mid-group) is in ``tests/chaos/test_parallel_call_kills.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.agent_tool_agents import eventually, unique
from threads_celery import Agent, ConfigError, Settings, Threads, tool
from threads_celery.runtime.batches import (
    first_wave,
    group_end,
    plan_groups,
    ready_to_show,
    slot_chain,
    slot_successor,
)
from threads_celery.testing import ScriptedModel, calls, say

pytestmark = pytest.mark.embedded(concurrency=5)

WAIT_S = 30.0


# -- pure planning -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "plan"),
    [
        ([], ()),
        ([True], (None,)),
        ([False, False], (None, None)),
        ([True, True], (0, 0)),
        ([True, True, False, True, True, True], (0, 0, None, 3, 3, 3)),
        ([False, True, True, False], (None, 1, 1, None)),
        ([True, False, True], (None, None, None)),
        ([False, True], (None, None)),
    ],
)
def test_only_runs_of_two_or_more_consecutive_concurrent_calls_form_a_group(
    flags: list[bool], plan: tuple[int | None, ...]
) -> None:
    assert plan_groups(flags) == plan


def test_group_end_first_wave_and_slot_successor() -> None:
    plan = plan_groups([False, True, True, True, True, True, False])
    assert group_end(plan, 1) == 6
    assert list(first_wave(1, 6, 2)) == [1, 2]
    assert list(first_wave(1, 6, 8)) == [1, 2, 3, 4, 5]
    assert [slot_successor(i, 6, 2) for i in range(1, 6)] == [3, 4, 5, None, None]
    assert (slot_chain(1, 6, 2), slot_chain(2, 6, 2), slot_chain(5, 6, 2)) == ([3, 5], [4], [])


@pytest.mark.parametrize(
    ("statuses", "shown", "complete"),
    [
        (["finished", "finished"], [0, 1], True),
        (["pending", "finished"], [], False),
        (["completed", "finished", "pending", "finished"], [1], False),
        (["completed", "error", "finished"], [2], True),
        (["completed", "completed"], [], True),
        (["finished", "skipped", "finished"], [0, 2], True),
    ],
)
def test_results_are_shown_in_call_order_only(statuses: list[str], shown: list[int], complete: bool) -> None:
    assert ready_to_show(statuses) == (shown, complete)


# -- definitions -------------------------------------------------------------------------------


class NumIn(BaseModel):
    n: int


def _noop(inp: Any, ctx: Any) -> str:
    return "ok"


@pytest.mark.parametrize("effect", ["unguarded", "idempotent", "reconcilable"])
def test_concurrent_on_a_tool_that_is_not_read_only_is_a_config_error_naming_it(
    effect: str,
) -> None:
    extra: dict[str, Any] = {}
    if effect == "idempotent":
        extra["dedup_window_ms"] = 1000
    if effect == "reconcilable":
        from threads_celery import NotFound, Reconcile

        extra["reconcile"] = Reconcile(finality="final", lookup=lambda key: NotFound())
    with pytest.raises(ConfigError, match=r"'charge'.*concurrent=True is only for effect='read_only'"):
        tool(
            name="charge",
            description="d",
            input=NumIn,
            execute=_noop,
            effect=effect,
            concurrent=True,
            **extra,
        )


def test_concurrent_with_ends_turn_is_a_config_error_naming_the_tool() -> None:
    with pytest.raises(ConfigError, match=r"'finish'.*ends_turn"):
        tool(
            name="finish",
            description="d",
            input=NumIn,
            execute=_noop,
            effect="read_only",
            ends_turn=True,
            concurrent=True,
        )


def test_concurrent_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"'look'.*True or False"):
        tool(
            name="look",
            description="d",
            input=NumIn,
            execute=_noop,
            effect="read_only",
            concurrent="yes",
        )  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_the_in_flight_limit_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_parallel_tool_calls"):
        Settings(max_parallel_tool_calls=bad)


def test_the_in_flight_limit_comes_from_the_environment() -> None:
    assert Settings.from_env(env={"THREADS_MAX_PARALLEL_TOOL_CALLS": "3"}).max_parallel_tool_calls == 3
    assert Settings.from_env(env={}).max_parallel_tool_calls == 8


# -- on the embedded runtime -------------------------------------------------------------------


def _agent(tools: list[Any], args: list[tuple[str, dict[str, Any]]]) -> Agent:
    return Agent(
        name=unique("parallel"),
        instructions="",
        model=ScriptedModel([calls(*args), say("all done")]),
        tools=tools,
    )


def _tool_results(threads: Threads, thread_id: str) -> list[Any]:
    return [m.tool_result for m in threads.messages(thread_id) if m.role == "tool"]


def test_a_group_overlaps_and_its_results_are_shown_and_emitted_in_call_order_whatever_order_they_finish(
    threads: Threads,
) -> None:
    finished = [threading.Event() for _ in range(4)]
    finish_order: list[int] = []

    def probe(inp: NumIn, ctx: Any) -> str:
        # Each call waits for the one after it: they finish 3, 2, 1, 0, and only if they overlap.
        if inp.n < 3 and not finished[inp.n + 1].wait(WAIT_S):
            raise TimeoutError(f"call {inp.n + 1} never finished while call {inp.n} ran")
        finish_order.append(inp.n)
        finished[inp.n].set()
        return f"result {inp.n}"

    probe_tool = tool(
        name="probe",
        description="d",
        input=NumIn,
        execute=probe,
        effect="read_only",
        concurrent=True,
    )
    agent = _agent([probe_tool], [("probe", {"n": n}) for n in range(4)])
    handle = threads.start(agent, "go")
    run = threads.wait(handle.run_id, WAIT_S)

    assert run.status == "completed", run.error
    assert finish_order == [3, 2, 1, 0]
    assert [(r.content, r.is_error) for r in _tool_results(threads, handle.thread_id)] == [
        (f"result {n}", False) for n in range(4)
    ]
    emitted = [
        e.payload["tool_result"]["content"]
        for e in threads.events(handle.thread_id)
        if e.type == "message" and e.payload.get("role") == "tool"
    ]
    assert emitted == [f"result {n}" for n in range(4)]
    assert run.output == "all done"


def test_a_call_in_order_keeps_its_place_between_two_groups(threads: Threads) -> None:
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    pairs = {0: threading.Barrier(2, timeout=WAIT_S), 1: threading.Barrier(2, timeout=WAIT_S)}

    def step(inp: NumIn, ctx: Any) -> str:
        with lock:
            log.append(("start", inp.n))
        if inp.n != 2:
            pairs[0 if inp.n < 2 else 1].wait()  # the two calls of each group run at once
        with lock:
            log.append(("end", inp.n))
        return str(inp.n)

    concurrent = tool(name="look", description="d", input=NumIn, execute=step, effect="read_only", concurrent=True)
    in_order = tool(name="look_alone", description="d", input=NumIn, execute=step, effect="read_only")
    agent = _agent(
        [concurrent, in_order],
        [
            ("look", {"n": 0}),
            ("look", {"n": 1}),
            ("look_alone", {"n": 2}),
            ("look", {"n": 3}),
            ("look", {"n": 4}),
        ],
    )
    handle = threads.start(agent, "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"

    position = {event: i for i, event in enumerate(log)}
    assert position[("start", 2)] > max(position[("end", 0)], position[("end", 1)])
    assert min(position[("start", 3)], position[("start", 4)]) > position[("end", 2)]
    assert [r.content for r in _tool_results(threads, handle.thread_id)] == [
        "0",
        "1",
        "2",
        "3",
        "4",
    ]


def test_a_call_that_raises_does_not_disturb_its_siblings(threads: Threads) -> None:
    def maybe_fail(inp: NumIn, ctx: Any) -> str:
        if inp.n == 1:
            raise RuntimeError("the index is down")
        return f"fine {inp.n}"

    fragile = tool(
        name="fragile",
        description="d",
        input=NumIn,
        execute=maybe_fail,
        effect="read_only",
        concurrent=True,
    )
    agent = _agent([fragile], [("fragile", {"n": n}) for n in range(3)])
    handle = threads.start(agent, "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert [(r.content, r.is_error) for r in _tool_results(threads, handle.thread_id)] == [
        ("fine 0", False),
        ("RuntimeError: the index is down", True),
        ("fine 2", False),
    ]


def test_bad_arguments_in_one_call_of_a_group_are_its_own_error(threads: Threads) -> None:
    fine = tool(
        name="fine",
        description="d",
        input=NumIn,
        execute=lambda inp, ctx: f"n={inp.n}",
        effect="read_only",
        concurrent=True,
    )
    agent = _agent([fine], [("fine", {"n": 1}), ("fine", {"n": "not a number"}), ("fine", {"n": 3})])
    handle = threads.start(agent, "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    results = _tool_results(threads, handle.thread_id)
    assert [(r.content, r.is_error) for r in (results[0], results[2])] == [
        ("n=1", False),
        ("n=3", False),
    ]
    assert results[1].is_error and "invalid arguments" in results[1].content


def _group_calls(threads: Threads, run_id: str) -> list[Any]:
    with threads.store.read() as tx:
        return tx.calls_in_step(run_id, 0)


def test_at_most_the_limit_run_at_once_and_every_call_runs() -> None:
    in_flight = 0
    peak = 0
    lock = threading.Lock()
    both_in = threading.Barrier(2, timeout=WAIT_S)
    ran: list[int] = []

    def counted(inp: NumIn, ctx: Any) -> str:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        if inp.n < 2:
            both_in.wait()  # the first wave of two really is in flight together
        with lock:
            in_flight -= 1
            ran.append(inp.n)
        return str(inp.n)

    counted_tool = tool(
        name="counted",
        description="d",
        input=NumIn,
        execute=counted,
        effect="read_only",
        concurrent=True,
    )
    with Threads.embedded(settings=Settings(model_retries=0, max_parallel_tool_calls=2), concurrency=5) as runtime:
        agent = _agent([counted_tool], [("counted", {"n": n}) for n in range(6)])
        handle = runtime.start(agent, "go")
        assert runtime.wait(handle.run_id, WAIT_S).status == "completed"
        assert [r.content for r in _tool_results(runtime, handle.thread_id)] == [str(n) for n in range(6)]
    assert peak == 2
    assert sorted(ran) == list(range(6))


def test_a_cancel_lets_running_calls_finish_and_skips_the_rest() -> None:
    entered = threading.Barrier(3, timeout=WAIT_S)  # the two running calls and the test
    gate = threading.Event()
    ran: list[int] = []

    def held(inp: NumIn, ctx: Any) -> str:
        ran.append(inp.n)
        entered.wait()
        if not gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return f"kept {inp.n}"

    held_tool = tool(name="held", description="d", input=NumIn, execute=held, effect="read_only", concurrent=True)
    with Threads.embedded(settings=Settings(model_retries=0, max_parallel_tool_calls=2), concurrency=5) as runtime:
        agent = _agent([held_tool], [("held", {"n": n}) for n in range(5)])
        handle = runtime.start(agent, "go")
        entered.wait()
        runtime.cancel(handle.run_id)
        gate.set()

        def settled() -> list[Any] | None:
            group = _group_calls(runtime, handle.run_id)
            return group if all(c.status != "pending" for c in group) else None

        group = eventually(settled, what="every call of the group settled")
        run = runtime.get_run(handle.run_id)
    assert run.status == "aborted"
    assert sorted(ran) == [0, 1]
    assert [(c.status, c.result) for c in group[:2]] == [
        ("finished", "kept 0"),
        ("finished", "kept 1"),
    ]
    assert all(c.status == "skipped" for c in group[2:]), [c.status for c in group]
