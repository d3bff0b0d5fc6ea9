"""A step or tool task that ended without doing its work ends, for monitors, in a state naming it.

The end of such a task is sent as an event of its own kind (``task-awaiting_approval``...) in
place of ``task-succeeded``; Celery's event state, which Flower keeps, lists the task in the state
that kind names. The tasks' outcomes reach the main process as their repr.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery.events.state import State
from celery.worker.request import Request

from threads_celery.worker.task_states import event_for, outcome_state, stated_request


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        ("awaiting approval: unguarded tool 'send_email' asks for approval first", "AWAITING_APPROVAL"),
        ("awaiting variables: API_KEY", "AWAITING_VARIABLE"),
        ("parked: tool 'charge' was interrupted mid-call: a person must decide", "PARKED"),
        ("parked: a usage limit was reached", "PARKED"),
        ("waiting on researcher (agent-tool:run_1:0:0)", "WAITING"),
        ("skipped: call already settled", "SKIPPED"),
        ("skipped: run is completed", "SKIPPED"),
        ("fence lost", "VOIDED"),
        ("gave up: threads.tool k failed 3 times in a row; the last error: boom", "GAVE_UP"),
        # The call ran, or its result was recorded: SUCCESS, the outcome in the result.
        ("completed", None),
        ("error", None),
        ("ended the turn", None),
        ("called send_email", None),
        ("recorded; the run is aborted", None),
    ],
)
def test_each_outcome_is_listed_in_the_state_that_names_it(outcome: str, state: str | None) -> None:
    assert outcome_state(repr(outcome)) == state  # what the main process is handed
    assert outcome_state(outcome) == state


def test_a_result_that_is_no_text_reads_as_a_success() -> None:
    assert outcome_state(None) is None
    assert outcome_state(3) is None


def test_only_a_success_event_is_replaced() -> None:
    fields = {"result": repr("awaiting approval: asks first"), "runtime": 0.1}
    assert event_for("task-succeeded", fields) == "task-awaiting_approval"
    assert event_for("task-succeeded", {"result": repr("completed")}) == "task-succeeded"
    assert event_for("task-received", {"name": "threads.tool send_email"}) == "task-received"
    assert event_for("task-failed", {"exception": "fence lost"}) == "task-failed"


class RecordingRequest(Request):
    """A Request whose events are recorded instead of sent (built without a message)."""

    sent: list[tuple[str, dict[str, Any]]]

    def send_event(self, type: str, **fields: Any) -> None:
        self.sent.append((type, fields))


def test_the_tasks_request_sends_a_held_calls_end_as_its_own_event() -> None:
    cls = stated_request(RecordingRequest)
    assert issubclass(cls, RecordingRequest)
    request = cls.__new__(cls)
    request.sent = []
    request.send_event("task-succeeded", result=repr("awaiting approval: asks first"), runtime=0.2)
    request.send_event("task-succeeded", result=repr("completed"), runtime=0.1)
    assert request.sent == [
        ("task-awaiting_approval", {"result": repr("awaiting approval: asks first"), "runtime": 0.2}),
        ("task-succeeded", {"result": repr("completed"), "runtime": 0.1}),
    ]


def test_celerys_event_state_lists_the_task_in_that_state_until_its_id_ends_otherwise() -> None:
    """What Flower keeps: the custom event's state, its result, and nothing marked succeeded."""
    state = State()
    common = {"uuid": "run_1:0:0~0a1b2c3d", "hostname": "w1", "local_received": 1.0, "clock": 1}
    state.event({**common, "type": "task-received", "timestamp": 1.0, "name": "threads.tool send_email"})
    state.event({**common, "type": "task-started", "timestamp": 1.1})
    ended = {"result": repr("awaiting approval: asks first"), "runtime": 0.1}
    state.event({**common, "type": event_for("task-succeeded", ended), "timestamp": 1.2, **ended})
    task = state.tasks["run_1:0:0~0a1b2c3d"]
    assert (task.state, task.result, task.succeeded) == (
        "AWAITING_APPROVAL",
        repr("awaiting approval: asks first"),
        None,
    )
    # A success under the same id would overwrite it: why a call published again gets an id of its own.
    state.event({**common, "type": "task-succeeded", "timestamp": 2.0, "result": repr("completed")})
    assert task.state == "SUCCESS"
