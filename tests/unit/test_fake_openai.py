"""The fake OpenAI server speaks the Chat Completions protocol well enough for real clients."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import importlib
import json
from urllib.parse import urlsplit

import openai
import pytest

from tests.support.fake_openai import FakeOpenAI, split_fragments

WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'
WEATHER_CALL = {"id": "call_1", "name": "get_weather", "arguments": WEATHER_ARGS}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _client(fake: FakeOpenAI) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.base_url, api_key="test", max_retries=0, timeout=10)


def _raw(method: str, url: str, body: dict | None = None) -> tuple[int, dict[str, str], str]:
    """A plain stdlib HTTP request (decodes chunked transfer encoding for us)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, parts.path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    finally:
        conn.close()


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Errors a client may raise when the server drops a stream (the SDK's HTTP library varies by version)."""
    errors: list[type[BaseException]] = [openai.APIError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(importlib.import_module(name).HTTPError)
    return tuple(errors)


def test_base_url_is_loopback_v1() -> None:
    with FakeOpenAI([]) as fake:
        assert fake.base_url.startswith("http://127.0.0.1:")
        assert fake.base_url.endswith("/v1")
        assert fake.port > 0


def test_non_streaming_text() -> None:
    with FakeOpenAI([{"text": "Hello there, general."}]) as fake:
        completion = _client(fake).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o-mini"
    choice = completion.choices[0]
    assert choice.index == 0
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello there, general."
    assert not choice.message.tool_calls
    assert completion.usage is not None
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert completion.usage.completion_tokens > 0
    assert fake.requests == [{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}]
    assert fake.errors == []
    assert fake.remaining == 0


def test_non_streaming_tool_call() -> None:
    with FakeOpenAI([{"tool_calls": [WEATHER_CALL]}]) as fake:
        completion = _client(fake).chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[WEATHER_TOOL],
        )
        assert fake.requests[0]["tools"] == [WEATHER_TOOL]
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id == "call_1"
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert call.function.arguments == WEATHER_ARGS


def test_streaming_text_arrives_in_several_deltas_with_usage() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    with FakeOpenAI([{"text": text}]) as fake:
        stream = _client(fake).chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "tell me something"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert fake.requests[0]["stream"] is True

    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) > 3
    assert "".join(contents) == text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    # The usage frame is last, has no choices, and only it carries usage.
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_without_include_usage_sends_no_usage_frame() -> None:
    with FakeOpenAI(["short answer"]) as fake:
        chunks = list(
            _client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stream=True)
        )
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(getattr(c, "usage", None) is None for c in chunks)


def test_streaming_tool_call_arguments_arrive_as_partial_json_fragments() -> None:
    second = {"id": "call_2", "name": "get_time", "arguments": {"tz": "Europe/Paris"}}
    with FakeOpenAI([{"text": "Let me check.", "tool_calls": [WEATHER_CALL, second]}]) as fake:
        chunks = list(
            _client(fake).chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "weather and time in Paris?"}],
                tools=[WEATHER_TOOL],
                stream=True,
            )
        )

    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    by_index: dict[int, list] = {}
    for delta in deltas:
        by_index.setdefault(delta.index, []).append(delta)
    assert sorted(by_index) == [0, 1]

    for index, (expected_id, expected_name, expected_args) in enumerate(
        [("call_1", "get_weather", WEATHER_ARGS), ("call_2", "get_time", json.dumps({"tz": "Europe/Paris"}))]
    ):
        opening, *rest = by_index[index]
        assert opening.id == expected_id
        assert opening.type == "function"
        assert opening.function.name == expected_name
        assert opening.function.arguments == ""
        fragments = [d.function.arguments for d in rest]
        assert all(d.id is None and d.function.name is None for d in rest)
        assert len(fragments) > 2
        assert "".join(fragments) == expected_args
        # Individually the fragments are not complete JSON documents.
        assert any(not _is_json(f) for f in fragments)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Let me check."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def _is_json(value: str) -> bool:
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def test_raw_sse_wire_format_ends_with_done() -> None:
    with FakeOpenAI([{"text": "hi"}]) as fake:
        status, headers, text = _raw(
            "POST",
            f"{fake.base_url}/chat/completions",
            {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}},
        )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert text.endswith("\n\n")
    events = [block for block in text.split("\n\n") if block]
    assert all(block.startswith("data: ") for block in events)
    assert events[-1] == "data: [DONE]"
    frames = [json.loads(block[len("data: ") :]) for block in events[:-1]]
    first = frames[0]
    assert set(first) >= {"id", "object", "created", "model", "choices"}
    assert first["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": "", "refusal": None},
        "logprobs": None,
        "finish_reason": None,
    }
    assert frames[-1]["choices"] == []
    assert set(frames[-1]["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_script_is_consumed_in_order_and_callable_scripts_see_the_request() -> None:
    with FakeOpenAI(["one", {"text": "two"}]) as fake:
        client = _client(fake)
        answers = [
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}])
            .choices[0]
            .message.content
            for q in ("a", "b")
        ]
    assert answers == ["one", "two"]
    assert [r["messages"][0]["content"] for r in fake.requests] == ["a", "b"]

    def echo(body: dict) -> dict:
        return {"text": "echo: " + body["messages"][-1]["content"]}

    with FakeOpenAI(echo) as fake:
        reply = _client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "ping"}])
        assert fake.remaining is None
    assert reply.choices[0].message.content == "echo: ping"


def test_exhausted_script_is_a_400_and_recorded() -> None:
    with FakeOpenAI(["only one"]) as fake:
        client = _client(fake)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
        with pytest.raises(openai.BadRequestError, match="script exhausted"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "2"}])
    assert len(fake.requests) == 2
    assert len(fake.errors) == 1 and "exhausted" in fake.errors[0]


def test_scripted_error_status() -> None:
    with FakeOpenAI([{"error": "slow down", "status": 429}, "ok"]) as fake:
        client = _client(fake)
        with pytest.raises(openai.RateLimitError, match="slow down"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert client.chat.completions.create(model="m", messages=[]).choices[0].message.content == "ok"
    assert fake.errors == []


def test_abort_after_drops_the_stream_midway() -> None:
    with FakeOpenAI([{"text": "this stream will be cut", "abort_after": 3}]) as fake:
        stream = _client(fake).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        received = []
        with pytest.raises(_transport_errors()):
            for chunk in stream:
                received.append(chunk)
    assert len(received) <= 3


def test_models_endpoint_and_unknown_paths() -> None:
    with FakeOpenAI([], model="gpt-fake-1") as fake:
        models = _client(fake).models.list()
        assert [m.id for m in models.data] == ["gpt-fake-1"]

        status, _, text = _raw("GET", f"{fake.base_url}/nope")
        assert status == 404
        assert json.loads(text)["error"]["code"] == "unknown_url"

        status, _, text = _raw("POST", f"{fake.base_url}/embeddings", {"input": "x"})
        assert status == 404
        assert "error" in json.loads(text)
        assert fake.requests == []


def test_split_fragments() -> None:
    assert split_fragments("abcdefghij", 4) == ["abcd", "efgh", "ij"]
    assert split_fragments("", 4) == []


# ------------------------------------------------------------------------ pydantic-ai


def _pydantic_ai_model(fake: FakeOpenAI):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=fake.base_url, api_key="test"))


def _weather_parameters():
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.tools import ToolDefinition

    return ModelRequestParameters(
        function_tools=[
            ToolDefinition(
                name="get_weather",
                description="Current weather for a city",
                parameters_json_schema={
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                    "required": ["city"],
                },
            )
        ]
    )


def test_pydantic_ai_streams_a_tool_call(allow_model_requests: None) -> None:
    from pydantic_ai.direct import model_request_stream
    from pydantic_ai.messages import ModelRequest, PartDeltaEvent, ToolCallPart, ToolCallPartDelta

    async def run(fake: FakeOpenAI):
        events = []
        async with model_request_stream(
            _pydantic_ai_model(fake),
            [ModelRequest.user_text_prompt("What is the weather in Paris?")],
            model_request_parameters=_weather_parameters(),
        ) as stream:
            async for event in stream:
                events.append(event)
        return events, stream.get()

    with FakeOpenAI([{"tool_calls": [WEATHER_CALL]}]) as fake:
        events, response = asyncio.run(run(fake))

    [request] = fake.requests
    assert request["stream"] is True
    assert [t["function"]["name"] for t in request["tools"]] == ["get_weather"]

    arg_deltas = [
        e.delta.args_delta
        for e in events
        if isinstance(e, PartDeltaEvent) and isinstance(e.delta, ToolCallPartDelta) and e.delta.args_delta
    ]
    assert len(arg_deltas) > 2  # pydantic-ai saw the arguments arrive piecemeal

    tool_calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    assert len(tool_calls) == 1
    [call] = tool_calls
    assert call.tool_name == "get_weather"
    assert call.tool_call_id == "call_1"
    assert call.args_as_dict() == {"city": "Paris", "unit": "celsius"}
    assert response.finish_reason == "tool_call"
    assert response.usage.output_tokens > 0


def test_pydantic_ai_non_streaming_text(allow_model_requests: None) -> None:
    from pydantic_ai.direct import model_request
    from pydantic_ai.messages import ModelRequest, TextPart

    with FakeOpenAI(["Sunny, 21 degrees."]) as fake:
        response = asyncio.run(model_request(_pydantic_ai_model(fake), [ModelRequest.user_text_prompt("weather?")]))
    assert [p.content for p in response.parts if isinstance(p, TextPart)] == ["Sunny, 21 degrees."]
    assert "stream" not in fake.requests[0] or fake.requests[0]["stream"] is False


def test_model_requests_are_forbidden_without_the_fixture() -> None:
    from pydantic_ai.direct import model_request
    from pydantic_ai.messages import ModelRequest

    with FakeOpenAI(["should never be sent"]) as fake, pytest.raises(RuntimeError, match="ALLOW_MODEL_REQUESTS"):
        asyncio.run(model_request(_pydantic_ai_model(fake), [ModelRequest.user_text_prompt("hi")]))
    assert fake.requests == []
