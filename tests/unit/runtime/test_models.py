"""The model adapter: stored messages to pydantic-ai messages, and one streamed model turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, Field
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from threads_celery import tool
from threads_celery.records import Message, ToolCall, ToolResult
from threads_celery.runtime.models import ModelTurn, StreamEvent, request_turn, to_model_messages
from threads_celery.testing import ScriptedModel, call, calls, say


def user(seq: int, text: str) -> Message:
    return Message(thread_id="t", seq=seq, role="user", text=text)


def assistant(seq: int, text: str = "", *tool_calls: ToolCall) -> Message:
    return Message(thread_id="t", seq=seq, role="assistant", text=text, tool_calls=tool_calls)


def result(seq: int, call_id: str, name: str, content: str, *, is_error: bool = False) -> Message:
    return Message(
        thread_id="t",
        seq=seq,
        role="tool",
        text=content,
        tool_result=ToolResult(call_id=call_id, name=name, content=content, is_error=is_error),
    )


def kinds(messages: list[Any]) -> list[tuple[str, list[str]]]:
    """Each message's kind and its parts' kinds, for comparing shapes at a glance."""
    return [(m.kind, [p.part_kind for p in m.parts]) for m in messages]


class CityIn(BaseModel):
    city: str = Field(description="City name")


weather = tool(
    name="get_weather",
    description="Get the weather.",
    input=CityIn,
    effect="read_only",
    execute=lambda inp, ctx: {"city": inp.city},
)


# -- to_model_messages ------------------------------------------------------------------------


def test_the_system_prompt_opens_the_first_request_with_the_user_message() -> None:
    out = to_model_messages("Be brief.", [user(0, "Hi")])
    assert kinds(out) == [("request", ["system-prompt", "user-prompt"])]
    system, prompt = out[0].parts
    assert isinstance(system, SystemPromptPart) and system.content == "Be brief."
    assert isinstance(prompt, UserPromptPart) and prompt.content == "Hi"


def test_an_empty_system_prompt_sends_no_system_part() -> None:
    out = to_model_messages("", [user(0, "Hi")])
    assert kinds(out) == [("request", ["user-prompt"])]


def test_an_assistant_reply_keeps_its_text_and_calls_in_order_with_raw_arguments() -> None:
    history = [
        user(0, "Weather in Paris and Rome?"),
        assistant(
            1,
            "Let me check.",
            ToolCall(id="c1", name="get_weather", args='{"city": "Paris"}', effect_key="r:0:0"),
            ToolCall(id="c2", name="get_weather", args='{"city": "Rome"}', effect_key="r:0:1"),
        ),
    ]
    out = to_model_messages("sys", history)
    assert kinds(out) == [
        ("request", ["system-prompt", "user-prompt"]),
        ("response", ["text", "tool-call", "tool-call"]),
    ]
    text, first, second = out[1].parts
    assert isinstance(text, TextPart) and text.content == "Let me check."
    assert isinstance(first, ToolCallPart) and isinstance(second, ToolCallPart)
    assert (first.tool_call_id, first.tool_name, first.args) == ("c1", "get_weather", '{"city": "Paris"}')
    assert (second.tool_call_id, second.args) == ("c2", '{"city": "Rome"}')


def test_results_of_one_reply_are_grouped_into_one_request_with_success_and_failure() -> None:
    history = [
        user(0, "Weather?"),
        assistant(
            1,
            "",
            ToolCall(id="c1", name="get_weather", args='{"city": "Paris"}', effect_key="r:0:0"),
            ToolCall(id="c2", name="get_weather", args='{"town": "Rome"}', effect_key="r:0:1"),
        ),
        result(2, "c1", "get_weather", '{"temp": 21}'),
        result(3, "c2", "get_weather", "city: field required", is_error=True),
        assistant(4, "Paris is at 21."),
    ]
    out = to_model_messages("sys", history)
    assert kinds(out) == [
        ("request", ["system-prompt", "user-prompt"]),
        ("response", ["tool-call", "tool-call"]),
        ("request", ["tool-return", "tool-return"]),
        ("response", ["text"]),
    ]
    ok, failed = out[2].parts
    assert isinstance(ok, ToolReturnPart) and isinstance(failed, ToolReturnPart)
    assert (ok.tool_call_id, ok.tool_name, ok.content, ok.outcome) == ("c1", "get_weather", '{"temp": 21}', "success")
    assert (failed.tool_call_id, failed.content, failed.outcome) == ("c2", "city: field required", "failed")


def test_a_user_message_after_tool_results_joins_their_request() -> None:
    history = [
        user(0, "Weather?"),
        assistant(1, "", ToolCall(id="c1", name="get_weather", args="{}", effect_key="r:0:0")),
        result(2, "c1", "get_weather", "sunny"),
        user(3, "And tomorrow?"),
    ]
    out = to_model_messages("", history)
    assert kinds(out) == [
        ("request", ["user-prompt"]),
        ("response", ["tool-call"]),
        ("request", ["tool-return", "user-prompt"]),
    ]
    assert out[2].parts[1].content == "And tomorrow?"


def test_consecutive_turns_alternate_requests_and_responses() -> None:
    history = [user(0, "one"), assistant(1, "1"), user(2, "two"), assistant(3, "2"), user(4, "three")]
    out = to_model_messages("sys", history)
    assert [m.kind for m in out] == ["request", "response", "request", "response", "request"]
    assert [p.content for p in out[0].parts] == ["sys", "one"]
    assert [p.content for m in out[1:] for p in m.parts] == ["1", "two", "2", "three"]


def test_an_empty_assistant_reply_is_an_empty_text_and_empty_arguments_are_an_empty_object() -> None:
    history = [
        user(0, "?"),
        assistant(1, ""),
        user(2, "again"),
        assistant(3, "", ToolCall(id="c1", name="get_weather", args="", effect_key="r:1:0")),
    ]
    out = to_model_messages("", history)
    assert isinstance(out[1], ModelResponse)
    assert [(p.part_kind, p.content) for p in out[1].parts] == [("text", "")]
    assert isinstance(out[3], ModelResponse)
    assert out[3].parts[0].args == "{}"


def test_an_empty_history_is_just_the_system_prompt() -> None:
    out = to_model_messages("sys", [])
    assert len(out) == 1 and isinstance(out[0], ModelRequest)
    assert kinds(out) == [("request", ["system-prompt"])]
    assert to_model_messages("", []) == []


# -- request_turn ----------------------------------------------------------------------------


def test_a_text_turn_streams_text_deltas_that_add_up_to_the_text() -> None:
    events: list[StreamEvent] = []
    model = ScriptedModel([say("The weather in Paris is sunny today.")], chunk_size=5)
    turn = request_turn(model, "sys", [user(0, "Weather?")], [weather], on_stream=events.append)
    assert isinstance(turn, ModelTurn)
    assert turn.text == "The weather in Paris is sunny today."
    assert turn.calls == ()
    texts = [e.text for e in events if e.kind == "text"]
    assert len(texts) > 1
    assert "".join(texts) == turn.text
    assert {e.kind for e in events} == {"text"}


def test_a_call_turn_streams_the_call_then_argument_fragments_that_add_up_to_the_arguments() -> None:
    events: list[StreamEvent] = []
    model = ScriptedModel([call("get_weather", city="Paris, Île-de-France")], chunk_size=4)
    turn = request_turn(model, "sys", [user(0, "Weather?")], [weather], on_stream=events.append)
    assert turn.text == ""
    assert len(turn.calls) == 1
    requested = turn.calls[0]
    assert requested.name == "get_weather"
    assert json.loads(requested.args) == {"city": "Paris, Île-de-France"}

    starts = [e for e in events if e.kind == "call"]
    assert [(e.index, e.name, e.call_id) for e in starts] == [(0, "get_weather", requested.call_id)]
    assert events[0].kind == "call", "the call is announced before its arguments"
    fragments = [e.text for e in events if e.kind == "args"]
    assert len(fragments) > 1
    assert "".join(fragments) == requested.args


def test_several_calls_keep_their_order_and_their_own_fragments() -> None:
    events: list[StreamEvent] = []
    model = ScriptedModel([calls(("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"}))], chunk_size=3)
    turn = request_turn(model, "", [user(0, "Both?")], [weather], on_stream=events.append)
    assert [json.loads(c.args) for c in turn.calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert len({c.call_id for c in turn.calls}) == 2
    by_index: dict[int, str] = {}
    for event in events:
        if event.kind == "args":
            by_index[event.index] = by_index.get(event.index, "") + event.text
    assert [by_index[e.index] for e in events if e.kind == "call"] == [c.args for c in turn.calls]


def test_malformed_arguments_are_kept_as_the_model_sent_them() -> None:
    model = ScriptedModel([call("get_weather", '{"city": "Par')])
    turn = request_turn(model, "", [user(0, "?")], [weather])
    assert turn.calls[0].args == '{"city": "Par'


def test_the_model_is_shown_the_tools_and_the_converted_conversation() -> None:
    seen: dict[str, Any] = {}

    async def stream(messages: list[Any], info: AgentInfo) -> Any:
        seen["messages"] = messages
        seen["tools"] = info.function_tools
        yield {0: DeltaToolCall(name="get_weather", json_args='{"city":', tool_call_id="x1")}
        yield {0: DeltaToolCall(json_args=' "Oslo"}')}

    async def respond(messages: list[Any], info: AgentInfo) -> Any:  # pragma: no cover - stream only
        raise AssertionError("request_turn streams")

    history = [user(0, "Oslo?")]
    turn = request_turn(FunctionModel(respond, stream_function=stream), "Be brief.", history, [weather])
    assert [(t.name, t.description) for t in seen["tools"]] == [("get_weather", "Get the weather.")]
    schema = seen["tools"][0].parameters_json_schema
    assert schema["properties"]["city"]["description"] == "City name"
    assert schema["required"] == ["city"]
    assert kinds(seen["messages"]) == [("request", ["system-prompt", "user-prompt"])]
    assert [(c.call_id, c.name, c.args) for c in turn.calls] == [("x1", "get_weather", '{"city": "Oslo"}')]


def test_a_failing_model_raises_out_of_request_turn() -> None:
    model = ScriptedModel([])
    with pytest.raises(Exception, match="script"):
        request_turn(model, "", [user(0, "?")], [weather])


def test_openai_strings_use_chat_completions_against_a_compatible_base_url(monkeypatch) -> None:
    from threads_celery.definitions import model_strings as models

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    models.forget_models()
    resolved = models.resolve_model("openai:gpt-4o-mini")
    assert type(resolved).__name__ == "OpenAIChatModel"
