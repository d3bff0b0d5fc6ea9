"""Where a branch begins (threads_celery.decisions.branches), from messages alone."""

from __future__ import annotations

import pytest

from threads_celery.decisions.branches import (
    BadBranchPoint,
    cut_history,
    prior_effect_reason,
    prior_effects,
)
from threads_celery.records import CallRow, Message, ToolCall, ToolResult


def user(seq: int, text: str = "hi") -> Message:
    return Message(thread_id="t", seq=seq, role="user", text=text, run_id="r")


def asks(seq: int, *ids: str, text: str = "") -> Message:
    calls = tuple(ToolCall(id=i, name="charge", args="{}", effect_key=f"r:0:{i}") for i in ids)
    return Message(thread_id="t", seq=seq, role="assistant", text=text, tool_calls=calls, run_id="r")


def result(seq: int, call_id: str) -> Message:
    return Message(
        thread_id="t", seq=seq, role="tool", text="ok", tool_result=ToolResult(call_id, "charge", "ok"), run_id="r"
    )


def test_a_point_after_every_result_keeps_the_prefix_as_it_is() -> None:
    history = [user(0), asks(1, "a"), result(2, "a"), Message("t", 3, "assistant", "done")]
    cut = cut_history(history, 2)
    assert cut.kept == tuple(history[:3]) and cut.rewritten == () and cut.dropped == ()
    assert cut.first_left == 3 and cut.left_behind == (history[3],)


def test_a_call_without_its_result_at_the_point_is_dropped_not_left_pending() -> None:
    history = [user(0), asks(1, "a", "b", text="Paying both."), result(2, "a"), result(3, "b")]
    cut = cut_history(history, 2)
    assert cut.kept == (history[0],)
    [assistant, kept_result] = cut.rewritten
    assert [c.id for c in assistant.tool_calls] == ["a"] and assistant.text == "Paying both."
    assert kept_result == history[2]
    assert cut.dropped == ("r:0:b",) and cut.first_left == 1


def test_an_assistant_message_of_unanswered_calls_alone_is_left_out() -> None:
    history = [user(0), asks(1, "a")]
    cut = cut_history(history, 1)
    assert cut.kept == (history[0],) and cut.rewritten == () and cut.dropped == ("r:0:a",)


def test_none_keeps_nothing_and_a_point_off_the_branch_is_refused() -> None:
    history = [user(0), user(2)]
    assert cut_history(history, None).left_behind == tuple(history)
    with pytest.raises(BadBranchPoint):
        cut_history(history, 1)  # a seq the current branch does not hold (left behind before)


def call(key: str, effect: str, attempt: int) -> CallRow:
    return CallRow(
        effect_key=key, run_id="r", thread_id="t", step=0, index=0, call_id=key, tool="charge", args="{}",
        status="completed", attempt=attempt, effect=effect,  # type: ignore[arg-type]
    )  # fmt: skip


def test_only_claimed_unguarded_and_reconcilable_calls_are_prior_effects() -> None:
    found = prior_effects(
        [call("u", "unguarded", 1), call("c", "reconcilable", 2), call("i", "idempotent", 1),
         call("r", "read_only", 1), call("never", "unguarded", 0)]
    )  # fmt: skip
    assert [p.effect_key for p in found] == ["u", "c"]
    assert prior_effect_reason("charge", found) is not None and "u, c" in str(prior_effect_reason("charge", found))
    assert prior_effect_reason("refund", found) is None
