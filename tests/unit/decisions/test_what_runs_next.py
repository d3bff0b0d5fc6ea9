"""What runs after a commit, decided once: ``after_reply``, ``after_call`` and ``after_results``.

Every site that commits a model reply or a call's result (the step commit, the general and the
one-statement result commit, a concurrent group's completion) records the task these name.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from threads_celery.decisions.next_step import (
    FinishRun,
    NextCall,
    NextStep,
    after_call,
    after_reply,
    after_results,
)
from threads_celery.records import CallRow


def make_call(index: int, calls_in_step: int, **overrides: Any) -> CallRow:
    values: dict[str, Any] = {
        "effect_key": f"run_1:2:{index}",
        "run_id": "run_1",
        "thread_id": "thread_1",
        "step": 2,
        "index": index,
        "call_id": f"call_{index}",
        "tool": "act",
        "args": "{}",
        "status": "started",
        "attempt": 1,
        "calls_in_step": calls_in_step,
    }
    values.update(overrides)
    return CallRow(**values)


# -- after a model reply ---------------------------------------------------------------------------


def test_a_reply_without_calls_finishes_the_run() -> None:
    assert after_reply(0) == FinishRun()


@pytest.mark.parametrize("calls", [1, 2, 7])
def test_a_reply_with_calls_dispatches_its_first_call(calls: int) -> None:
    assert after_reply(calls) == NextCall(0)


# -- after a call's result, in order ---------------------------------------------------------------


def test_a_lone_call_is_followed_by_the_next_model_step() -> None:
    assert after_call(make_call(0, 1), ends_turn=False) == NextStep()


def test_a_call_before_the_last_is_followed_by_the_call_after_it() -> None:
    assert after_call(make_call(0, 3), ends_turn=False) == NextCall(1)
    assert after_call(make_call(1, 3), ends_turn=False) == NextCall(2)


def test_the_last_call_of_a_reply_is_followed_by_the_next_model_step() -> None:
    assert after_call(make_call(2, 3), ends_turn=False) == NextStep()


@pytest.mark.parametrize(("index", "calls"), [(0, 1), (0, 3), (2, 3)])
def test_a_call_that_ends_the_turn_finishes_the_run_wherever_it_is(index: int, calls: int) -> None:
    assert after_call(make_call(index, calls), ends_turn=True) == FinishRun()


def test_the_call_read_with_its_successor_still_decides_by_position() -> None:
    # The row read with its next call (the one-statement commit's input) decides the same way.
    call = make_call(0, 2, next_call=("run_1:2:1", "act", None))
    assert after_call(call, ends_turn=False) == NextCall(1)


# -- after a concurrent group's results ------------------------------------------------------------


def test_a_complete_group_that_ends_the_reply_is_followed_by_the_next_model_step() -> None:
    assert after_results(4, 4) == NextStep()


def test_a_complete_group_before_more_calls_is_followed_by_the_call_after_it() -> None:
    assert after_results(3, 5) == NextCall(3)


@given(st.integers(min_value=1, max_value=50), st.data())
def test_property_in_order_the_calls_are_dispatched_one_after_another_then_the_step(
    calls: int, data: st.DataObject
) -> None:
    seen: list[object] = [after_reply(calls)]
    while isinstance(seen[-1], NextCall):
        index = seen[-1].index
        assert index == len(seen) - 1  # each call once, in order
        seen.append(after_call(make_call(index, calls), ends_turn=False))
    assert seen[-1] == NextStep()
    assert len(seen) == calls + 1
    # An ends_turn call anywhere in the reply ends the run instead.
    anywhere = data.draw(st.integers(min_value=0, max_value=calls - 1))
    assert after_call(make_call(anywhere, calls), ends_turn=True) == FinishRun()
