"""Prompt tools (return shaping, input mapping) and subagents (relationships, lifecycle tools)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from threads_celery import Agent, ConfigError, Permissions, Prompt, SubagentRelationship, Threads, tool
from threads_celery.testing import ScriptedModel, call, say


class In(BaseModel):
    q: str


def _lookup(inp: In, ctx) -> str:
    if inp.q == "boom":
        raise ValueError("lookup failed")
    return f"found {inp.q}"


lookup = tool(name="lookup", description="Look up.", input=In, effect="read_only", execute=_lookup)


class SumIn(BaseModel):
    text: str
    style: str = "brief"


def summarizer() -> Prompt:
    return Prompt(
        name="summarize",
        instructions="Summarize.",
        model=ScriptedModel([call("lookup", q="facts"), call("lookup", q="boom"), say("Short summary.")]),
        tools=[lookup],
    )


def _tool_results(threads: Threads, thread_id: str) -> list[str]:
    return [m.text for m in threads.messages(thread_id) if m.role == "tool"]


def _run(parent: Agent) -> tuple[list[str], list[str]]:
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(parent, "go").run_id, 30)
        assert run.status == "completed"
        children = threads.agent_tool_runs(run.thread_id)
        child_first = [threads.messages(c.child_thread_id)[0].text for c in children]
        return _tool_results(threads, run.thread_id), child_first


def _parent(prompt_tool, *calls_) -> Agent:
    return Agent(name="parent", instructions="x", model=ScriptedModel([*calls_, say("done")]), tools=[prompt_tool])


def test_prompt_tool_returns_only_the_text_by_default_and_maps_the_first_message() -> None:
    prompt_tool = summarizer().as_tool(description="Summarize.", input=SumIn, init_user_message_property="text")
    results, first_messages = _run(_parent(prompt_tool, call("summarize", text="a long text", style="brief")))
    shaped = json.loads(results[0])
    assert shaped == {"text": "Short summary.", "errors": ["ValueError: lookup failed"]}
    assert first_messages == ["a long text"]


def test_prompt_tool_flags_shape_the_return() -> None:
    prompt_tool = summarizer().as_tool(
        input=SumIn, init_user_message_property="text", include_tool_calls=True, include_errors=False
    )
    results, _ = _run(_parent(prompt_tool, call("summarize", text="t")))
    shaped = json.loads(results[0])
    assert shaped["text"] == "Short summary."
    assert [(c["name"], c["args"], c["result"], c["is_error"]) for c in shaped["tool_calls"]] == [
        ("lookup", {"q": "facts"}, "found facts", False),
        ("lookup", {"q": "boom"}, "ValueError: lookup failed", True),
    ]
    assert "errors" not in shaped


def test_text_only_return_is_the_plain_text() -> None:
    prompt_tool = summarizer().as_tool(input=SumIn, init_user_message_property="text", include_errors=False)
    results, _ = _run(_parent(prompt_tool, call("summarize", text="t")))
    assert results == ["Short summary."]


def test_prompt_tool_options_name_real_fields() -> None:
    with pytest.raises(ConfigError, match="not a field"):
        summarizer().as_tool(input=SumIn, init_user_message_property="body")


helper = Agent(name="helper", instructions="Help.", model=ScriptedModel(["hello from helper"], per="run"))


def _boss(*script, hidden: bool = False) -> Agent:
    return Agent(
        name="boss",
        instructions="x",
        model=ScriptedModel([*script, say("done")]),
        subagents=[SubagentRelationship("helper", helper, "A helper.", hidden=hidden)],
        permissions=Permissions.allow_all(),
    )


def test_lifecycle_tools_are_injected_for_non_hidden_relationships_only() -> None:
    assert [t.name for t in _boss().runtime_tools] == ["subagents", "subagent_create", "subagent_message"]
    assert _boss(hidden=True).runtime_tools == ()


def test_subagent_instances_are_child_threads_that_keep_their_conversation() -> None:
    def message_it(messages):
        instance = json.loads(messages[-1].parts[0].content)["instance_id"]
        return call("subagent_message", instance_id=instance, message="again")

    boss = _boss(call("subagent_create", subagent="helper", message="hi"), message_it, call("subagents"))
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(boss, "go").run_id, 30)
        assert run.status == "completed"
        created, messaged, listed = (json.loads(t) for t in _tool_results(threads, run.thread_id))
        assert created["instance_id"] == messaged["instance_id"]
        assert created["reply"] == messaged["reply"] == "hello from helper"
        assert [i["instance_id"] for i in listed] == [created["instance_id"]]
        conversation = [(m.role, m.text) for m in threads.messages(created["instance_id"])]
    assert conversation == [
        ("user", "hi"),
        ("assistant", "hello from helper"),
        ("user", "again"),
        ("assistant", "hello from helper"),
    ]


def test_a_create_refused_by_the_concurrency_cap_lists_no_instance() -> None:
    boss = _boss(call("subagent_create", subagent="helper", message="hi"), call("subagents"))
    boss.max_concurrent_agent_tools = 0  # every launch is past the cap
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(boss, "go").run_id, 30)
        assert run.status == "completed"
        created, listed = _tool_results(threads, run.thread_id)
        assert "too many concurrent agent tool runs" in created
        # The refused create never got a child thread: listing it used to show an instance whose
        # id was null, which no subagent_message can reach.
        assert json.loads(listed) == []


def test_unknown_subagents_and_instances_are_errors_the_model_sees_and_the_run_goes_on() -> None:
    boss = _boss(
        call("subagent_create", subagent="ghost", message="x"),
        call("subagent_message", instance_id="nope", message="x"),
    )
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(boss, "go").run_id, 30)
        assert run.status == "completed"
        results = _tool_results(threads, run.thread_id)
        assert threads.agent_tool_runs(run.thread_id) == []  # nothing was spawned
    assert results == ["unknown subagent 'ghost'; known: helper", "unknown subagent instance 'nope'"]


def test_a_subagent_relationship_in_a_tools_entry_is_a_definition_time_error() -> None:
    with pytest.raises(ConfigError, match="relationship, not a tool"):
        Agent(name="bad", instructions="x", model=ScriptedModel([]), tools=[SubagentRelationship("helper", helper)])


def test_relationship_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        SubagentRelationship("subagent_create", helper)
    with pytest.raises(ConfigError, match="must be an Agent"):
        SubagentRelationship("x", "helper")  # type: ignore[arg-type]
