"""The Celery task id of each publish: a step's is its key; a tool call's, its effect key and a
token of that publish, so that each attempt of a call that waited is a task of its own in Flower."""

from __future__ import annotations

import re

from threads_celery.transitions.publishing import task_id
from threads_celery.transitions.runs import step_entry, tool_entry


def test_a_calls_id_is_its_effect_key_and_a_token_fresh_to_each_publish() -> None:
    entry = tool_entry("run_1:0:0", "send_email", None)
    ids = {task_id(entry) for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"run_1:0:0~[0-9a-f]{8}", i) for i in ids)


def test_a_steps_id_is_its_key_on_every_publish() -> None:
    entry = step_entry("run_1", 2, "trip-planner")
    assert {task_id(entry) for _ in range(3)} == {"step:run_1:2"}
