"""The real OpenAI provider path through the runtime, against the loopback fake server.

An agent whose model is pydantic-ai's ``OpenAIChatModel`` (or the model string
``openai-chat:gpt-4o-mini`` with ``OPENAI_BASE_URL`` pointing at the fake) runs in
``Threads.embedded()``: the fake streams a tool call whose arguments arrive in small fragments,
then a final text. Nothing here reaches the network: the fake listens on 127.0.0.1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.fake_openai import FakeOpenAI
from threads_celery import Agent, Threads, tool
from threads_celery.definitions import model_strings
from threads_celery.records import Message
from threads_celery.runtime.models import StreamEvent, request_turn

pytestmark = pytest.mark.usefixtures("allow_model_requests")

INSTRUCTIONS = "You are a weather assistant. Use get_weather."
ARGUMENTS = '{"city": "Paris", "unit": "f"}'


class WeatherIn(BaseModel):
    city: str
    unit: str = "c"


def _weather_tool(seen: list[dict[str, Any]]) -> Any:
    def execute(inp: WeatherIn, _ctx: Any) -> dict[str, Any]:
        seen.append(inp.model_dump())
        return {"city": inp.city, "unit": inp.unit, "temperature": 70}

    return tool(
        name="get_weather",
        description="Get the current weather for a city.",
        input=WeatherIn,
        effect="read_only",
        execute=execute,
    )


def _script() -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"id": "call_weather_1", "name": "get_weather", "arguments": ARGUMENTS}]},
        {"text": "It is 70 degrees in Paris."},
    ]


def _run_weather(agent: Agent) -> tuple[Any, list[Message]]:
    with Threads.embedded() as threads:
        handle = threads.start(agent, "What is the weather in Paris?")
        run = threads.wait(handle.run_id, timeout=30)
        return run, threads.messages(handle.thread_id)


def _assert_provider_conversation(
    fake: FakeOpenAI, run: Any, messages: list[Message], seen: list[dict[str, Any]]
) -> None:
    assert fake.errors == []
    assert run.status == "completed", run.error
    assert run.output == "It is 70 degrees in Paris."
    # The tool ran once, with the arguments reassembled from the streamed fragments.
    assert seen == [{"city": "Paris", "unit": "f"}]
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].tool_calls[0].id == "call_weather_1"
    assert json.loads(messages[1].tool_calls[0].args) == {"city": "Paris", "unit": "f"}
    assert messages[2].tool_result is not None and messages[2].tool_result.call_id == "call_weather_1"

    assert len(fake.requests) == 2
    first, second = fake.requests
    for body in fake.requests:
        assert body["stream"] is True
        assert body["model"] == "gpt-4o-mini"
        assert body["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
        assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert first["messages"][1] == {"role": "user", "content": "What is the weather in Paris?"}
    assert first["tools"][0]["function"]["parameters"]["required"] == ["city"]

    assistant, tool_message = second["messages"][2], second["messages"][3]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["id"] == "call_weather_1"
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "unit": "f"}
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_weather_1"
    assert json.loads(tool_message["content"]) == {"city": "Paris", "unit": "f", "temperature": 70}
    assert len(second["messages"]) == 4


def test_openai_chat_model_object_runs_a_tool_call_through_the_runtime() -> None:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen: list[dict[str, Any]] = []
    with FakeOpenAI(_script(), arguments_chunk_size=3) as fake:
        model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=fake.base_url, api_key="test"))
        agent = Agent(name="weather_object", instructions=INSTRUCTIONS, model=model, tools=[_weather_tool(seen)])
        run, messages = _run_weather(agent)
        _assert_provider_conversation(fake, run, messages, seen)


def test_openai_model_string_uses_openai_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    # ``openai-chat:``, not ``openai:``: since pydantic-ai 2, ``openai:`` means the Responses API
    # (POST /v1/responses), which OpenAI-compatible servers (and this fake) do not offer.
    # Model strings are resolved once per process and cached: start and end with a clean cache,
    # so this test builds its provider from the environment below and leaves no stale model.
    model_strings.forget_models()
    seen: list[dict[str, Any]] = []
    with FakeOpenAI(_script(), arguments_chunk_size=3) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        agent = Agent(
            name="weather_string",
            instructions=INSTRUCTIONS,
            model="openai-chat:gpt-4o-mini",
            tools=[_weather_tool(seen)],
        )
        run, messages = _run_weather(agent)
        _assert_provider_conversation(fake, run, messages, seen)
    model_strings.forget_models()


def test_streamed_argument_fragments_concatenate_to_the_arguments() -> None:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen: list[dict[str, Any]] = []
    script = [
        {
            "text": "Checking.",
            "tool_calls": [{"id": "call_weather_1", "name": "get_weather", "arguments": ARGUMENTS}],
        }
    ]
    events: list[StreamEvent] = []
    history = [Message(thread_id="t", seq=0, role="user", text="Weather in Paris?")]
    with FakeOpenAI(script, arguments_chunk_size=4, text_chunk_size=3) as fake:
        model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=fake.base_url, api_key="test"))
        turn = request_turn(model, INSTRUCTIONS, history, [_weather_tool(seen)], on_stream=events.append)
    assert turn.text == "Checking."
    assert [(c.call_id, c.name) for c in turn.calls] == [("call_weather_1", "get_weather")]
    assert json.loads(turn.calls[0].args) == {"city": "Paris", "unit": "f"}
    assert "".join(e.text for e in events if e.kind == "text") == "Checking."
    assert [(e.name, e.call_id) for e in events if e.kind == "call"] == [("get_weather", "call_weather_1")]
    fragments = [e.text for e in events if e.kind == "args"]
    assert len(fragments) > 1, "the fake streams the arguments in several fragments"
    assert "".join(fragments) == ARGUMENTS
    assert turn.usage["input_tokens"] > 0 and turn.usage["output_tokens"] > 0
    assert seen == []  # asking for a call does not run it
