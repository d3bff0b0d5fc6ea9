"""The one retry policy: each failing thing's waits, and when it gives up."""

from __future__ import annotations

import pytest

from threads_celery.decisions.retry import (
    DELIVERY_BACKOFF,
    MODEL_STEP_BACKOFF,
    PROVIDER_BACKOFF,
    REPUBLISH_BACKOFF,
    STORE_RECONNECT_BACKOFF,
    STORE_UNAVAILABLE_BACKOFF,
    TASK_FAILURE_BACKOFF,
    Backoff,
    GiveUp,
    RetryDecision,
    Schedule,
    decide_model_step_retry,
    decide_task_failure,
    is_refused_request,
)


def test_a_backoff_doubles_from_its_first_wait_up_to_its_cap() -> None:
    backoff = Backoff(first_s=1.0, cap_s=10.0)
    assert [backoff.delay_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.delay_s(0) == backoff.delay_s(-3) == 1.0


def test_a_schedule_repeats_its_last_wait() -> None:
    schedule = Schedule((5.0, 15.0))
    assert [schedule.delay_s(n) for n in range(0, 5)] == [5.0, 5.0, 15.0, 15.0, 15.0]


@pytest.mark.parametrize(
    ("policy", "waits"),
    [
        (TASK_FAILURE_BACKOFF, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
        (MODEL_STEP_BACKOFF, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
        (PROVIDER_BACKOFF, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]),
        (DELIVERY_BACKOFF, [5.0, 15.0, 30.0, 120.0, 120.0, 120.0, 120.0]),
        (STORE_RECONNECT_BACKOFF, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]),
        (STORE_UNAVAILABLE_BACKOFF, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
        (REPUBLISH_BACKOFF, [2.0, 4.0, 8.0, 16.0, 16.0, 16.0, 16.0]),  # in graces
    ],
)
def test_the_waits_of_each_policy(policy: Backoff | Schedule, waits: list[float]) -> None:
    assert [policy.delay_s(n) for n in range(1, 8)] == pytest.approx(waits)


def test_a_failing_task_is_tried_again_with_backoff_then_given_up_at_its_limit() -> None:
    assert decide_task_failure("threads.tool", "k", 1, 3, "boom") == RetryDecision(1.0)
    assert decide_task_failure("threads.tool", "k", 2, 3, "boom") == RetryDecision(2.0)
    assert decide_task_failure("threads.tool", "k", 3, 3, "boom") == GiveUp(
        "threads.tool k failed 3 times in a row; the last error: boom"
    )
    assert isinstance(decide_task_failure("threads.step", "r", 9, 3, "boom"), GiveUp)


@pytest.mark.parametrize(
    ("status", "refused"),
    [
        *[(None, False), ("400", False), (400, True), (401, True), (404, True), (422, True), (499, True)],
        *[(408, False), (409, False), (425, False), (429, False), (500, False), (503, False), (302, False)],
    ],
)
def test_only_a_4xx_the_provider_will_repeat_is_a_refused_request(status: object, refused: bool) -> None:
    assert is_refused_request(status) is refused


def test_a_failed_model_step_is_retried_with_backoff_while_it_has_retries() -> None:
    for attempt, wait in enumerate([1.0, 2.0, 4.0]):
        decision = decide_model_step_retry(attempt=attempt, retries=3, status=None, step=0, reason="reset")
        assert decision == RetryDecision(wait)
    assert decide_model_step_retry(attempt=3, retries=3, status=503, step=2, reason="reset") == GiveUp(
        "model step 2 failed after 4 attempts: reset"
    )


def test_a_refused_model_request_is_not_retried() -> None:
    assert decide_model_step_retry(attempt=0, retries=3, status=401, step=1, reason="bad key") == GiveUp(
        "model step 1 failed after 1 attempt: bad key"
    )
    assert isinstance(decide_model_step_retry(attempt=0, retries=3, status=429, step=1, reason="x"), RetryDecision)


def test_model_retries_count_turns_in_a_row_per_tool_and_run() -> None:
    from threads_celery.decisions.retry import model_retries
    from threads_celery.records import Message, ToolCall, ToolResult

    def turn(seq: int, run: str = "r1") -> Message:
        return Message("t", seq, "assistant", tool_calls=(ToolCall(f"c{seq}", "lookup", "{}", f"k{seq}"),), run_id=run)

    def result(seq: int, kind: str | None, name: str = "lookup", run: str = "r1") -> Message:
        return Message(
            "t", seq, "tool", tool_result=ToolResult(f"c{seq}", name, "x", kind is not None, kind), run_id=run
        )

    history = [Message("t", 0, "user", "go", run_id="r1"), turn(1), result(2, "invalid"), turn(3)]
    assert model_retries(history, "r1", "lookup") == 1
    history += [result(4, "retry"), turn(5)]
    assert model_retries(history, "r1", "lookup") == 2
    history += [result(6, "json"), turn(7)]  # a success resets it
    assert model_retries(history, "r1", "lookup") == 0
    history += [result(8, "retry", name="other"), turn(9)]
    assert model_retries(history, "r1", "lookup") == 0 and model_retries(history, "r1", "other") == 1
    assert model_retries(history, "r2", "other") == 0  # counted per run
