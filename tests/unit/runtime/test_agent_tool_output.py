"""Agent-tool output schemas: ``agent_tool(..., output=Model)``.

The child's final output (its ``get_agent_tool_output``, else its last assistant text read as
JSON) is validated against the schema; output that fails reaches the parent as a structured
``AgentToolFailure``, never as a success. Pure checks first, then runs on the embedded runtime.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.agent_tool_agents import RecordingParent, unique
from threads_celery import Agent, ConfigError, Threads, agent_tool
from threads_celery.definitions.agent_tools import check_child_output
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 30.0


class Report(BaseModel):
    title: str
    rows: int


def _child(text: str) -> Agent:
    return Agent(name=unique("reporter"), instructions="", model=ScriptedModel([say(text)]))


# -- the pure check ----------------------------------------------------------------------------


def test_a_fitting_json_text_is_validated_and_dumped() -> None:
    definition = agent_tool(_child("x"), "Report.", output=Report)
    value, error = check_child_output(definition, "reporter", '{"title": "t", "rows": "3"}')
    assert (value, error) == ({"title": "t", "rows": 3}, None)


def test_a_fitting_mapping_is_validated() -> None:
    definition = agent_tool(_child("x"), "Report.", output=Report)
    assert check_child_output(definition, "reporter", {"title": "t", "rows": 1}) == (
        {"title": "t", "rows": 1},
        None,
    )


@pytest.mark.parametrize(
    "bad",
    [
        "plain prose, not JSON",
        '{"title": "t"}',
        '{"title": "t", "rows": "many"}',
        "[1, 2]",
        "",
        {"rows": 1},
        None,
    ],
)
def test_output_that_fails_the_schema_is_an_error_naming_the_schema(bad: Any) -> None:
    definition = agent_tool(_child("x"), "Report.", output=Report)
    value, error = check_child_output(definition, "reporter", bad)
    assert value is None
    assert error is not None and "fails its output schema Report" in error and "'reporter'" in error


def test_without_a_schema_the_output_passes_untouched() -> None:
    definition = agent_tool(_child("x"), "Report.")
    assert check_child_output(definition, "reporter", "anything") == ("anything", None)


def test_an_output_pydantic_cannot_validate_is_a_config_error_naming_the_tool() -> None:
    with pytest.raises(ConfigError, match=r"'report'.*output"):
        agent_tool(_child("x"), "Report.", name="report", output=object())


# -- on the embedded runtime -------------------------------------------------------------------


def _run_parent(threads: Threads, child: Agent) -> tuple[Any, Any]:
    parent = RecordingParent(
        unique("parent"),
        tools=[agent_tool(child, "Report.", name="report", output=Report)],
        script=[call("report", message="go"), say("parent done")],
    )
    handle = threads.start(parent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [tool_message] = [m for m in threads.messages(handle.thread_id) if m.role == "tool"]
    [row] = threads.agent_tool_runs(handle.thread_id)
    return tool_message.tool_result, row


def test_a_child_whose_final_text_fits_returns_the_validated_output(threads: Threads) -> None:
    result, row = _run_parent(threads, _child('{"title": "weekly", "rows": "4"}'))
    assert (result.is_error, json.loads(result.content)) == (False, {"title": "weekly", "rows": 4})
    assert (row.status, row.output) == ("completed", {"title": "weekly", "rows": 4})


def test_a_child_whose_final_text_fails_the_schema_reaches_the_parent_as_a_structured_error(
    threads: Threads,
) -> None:
    result, row = _run_parent(threads, _child("I could not find any rows, sorry."))
    envelope = json.loads(result.content)
    assert result.is_error is True
    assert (envelope["ok"], envelope["status"], envelope["retryable"]) == (False, "error", False)
    assert "fails its output schema Report" in envelope["error"]
    assert (row.status, row.output) == ("error", None)
    assert "fails its output schema Report" in (row.error or "")


class BadExtractor(Agent):
    """A child whose structured output misses a required field."""

    def get_agent_tool_output(self, run_id: str) -> Any:
        return {"title": "no rows field"}


def test_structured_output_of_get_agent_tool_output_is_checked_too(threads: Threads) -> None:
    child = BadExtractor(
        name=unique("bad_extractor"),
        instructions="",
        model=ScriptedModel([say('{"title": "t", "rows": 1}')]),
    )
    result, row = _run_parent(threads, child)
    envelope = json.loads(result.content)
    assert result.is_error is True and envelope["status"] == "error"
    assert "rows" in envelope["error"] and row.status == "error"
