"""What ``start(on_finish=...)`` accepts of a Celery signature, and the message it becomes."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chain

from threads_celery import Agent, Threads
from threads_celery.exceptions import ConfigError
from threads_celery.records import Run
from threads_celery.testing import ScriptedModel, say
from threads_celery.transitions.finish_callbacks import MAX_SIGNATURE_BYTES, callback_entry, signature_spec

app = Celery("proj", set_as_current=False)


@app.task(name="proj.answered")
def answered(outcome: dict[str, str], order_id: int, *, note: str = "") -> None:
    """A task of the project's."""


def run() -> Run:
    return Run(id="run_1", thread_id="thread_1", agent="support", status="completed", step=2, fence=3, input="")


def test_a_signature_is_kept_as_its_task_arguments_and_queue() -> None:
    spec = signature_spec(answered.s(42, note="vip").set(queue="orders"))
    assert spec == {
        "task": "proj.answered", "args": [42], "kwargs": {"note": "vip"}, "queue": "orders", "immutable": False,
    }  # fmt: skip


def test_the_outcome_goes_first_as_a_link_gets_its_parents_result() -> None:
    entry = callback_entry(run(), signature_spec(answered.s(42, note="vip")), "completed")
    outcome = {"run_id": "run_1", "thread_id": "thread_1", "agent": "support", "status": "completed"}
    assert entry.task == "proj.answered" and entry.args == (outcome, 42)
    assert entry.kwargs == {"note": "vip"} and entry.key == "finish:run_1" and entry.user_task
    assert entry.queue is None  # the app's routes place it


def test_an_immutable_signature_gets_its_own_arguments_only() -> None:
    entry = callback_entry(run(), signature_spec(answered.si({"fixed": "x"}, 7)), "error")
    assert entry.args == ({"fixed": "x"}, 7)


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ("proj.answered", TypeError, "takes a Celery signature"),
        ({"args": [1]}, TypeError, "takes a Celery signature"),
        ({"task": ""}, ValueError, "names no task"),
        (answered.s(1).set(countdown=5), ValueError, "['countdown'] are not honoured"),
        (answered.s(1).set(queue="threads.control"), ValueError, "reserved for the backbone"),
        (answered.s(object()), TypeError, "must be JSON values"),
        (answered.s("x" * MAX_SIGNATURE_BYTES), ValueError, "pass ids instead"),
        (chain(answered.s(1), answered.s(2)), ValueError, "not a chain"),
    ],
)
def test_what_could_not_be_sent_as_it_says_is_refused_naming_why(given: Any, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=None) as refused:
        signature_spec(given)
    assert says in str(refused.value), refused.value


def test_an_embedded_runtime_refuses_on_finish_before_recording_anything() -> None:
    agent = Agent(name="finish-embedded", instructions="x", model=ScriptedModel([say("done")]))
    with Threads.embedded() as threads:
        with pytest.raises(ConfigError, match="no app of yours"):
            threads.start(agent, "hi", on_finish=answered.s(1))
        assert threads.runs() == []
