"""What the model sees, side by side: plain Pydantic AI and from_pydantic_ai on the same model.

- A tool that raises ``ModelRetry`` reaches the model as Pydantic AI's retry prompt, and
  ``ctx.retry`` counts those retries as Pydantic AI counts them ([0, 1]); arguments that fail
  validation are a retry prompt too.
- A tool's result reaches the model as the object it returned, not as JSON text: the same
  TestModel run gives the same output as plain Pydantic AI (it used to double-encode).
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from threads_celery import Permissions, Threads, from_pydantic_ai

WAIT_S = 30.0
_names = itertools.count()


def run_durable(threads: Threads, source: PydanticAgent[Any, Any]) -> str | None:
    agent = from_pydantic_ai(source, permissions=Permissions.allow_all())
    run = threads.wait(threads.start(agent, "go").run_id, WAIT_S)
    assert run.status == "completed", run.error
    return run.output


def last_request_parts(messages: list[ModelMessage]) -> list[tuple[str, Any]]:
    request = messages[-1]
    assert isinstance(request, ModelRequest)
    shown: list[tuple[str, Any]] = []
    for part in request.parts:
        if isinstance(part, ToolReturnPart):
            shown.append(("retry" if part.outcome == "retried" else "return", part.content))
    return shown


def build_retrying(model: FunctionModel, name: str | None, retries_seen: list[int]) -> PydanticAgent[None, str]:
    agent = PydanticAgent(model, name=name, retries=3)

    @agent.tool
    def lookup(ctx: RunContext[None], code: str) -> dict[str, Any]:
        """Look a code up."""
        retries_seen.append(ctx.retry)
        if code != "ok":
            raise ModelRetry("use the code 'ok'")
        return {"code": code, "found": True}

    return agent


def scripted_caller(seen: list[list[tuple[str, Any]]]) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn > 0:
            seen.append(last_request_parts(messages))
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart("lookup", {"code": 7})])  # not a string: invalid
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("lookup", {"code": "bad"})])
        if turn == 2:
            return ModelResponse(parts=[ToolCallPart("lookup", {"code": "ok"})])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(answer)


def test_model_retry_and_invalid_arguments_are_retry_prompts_counted_as_pydantic_ai_counts(threads: Threads) -> None:
    plain_seen: list[list[tuple[str, Any]]] = []
    plain_retries: list[int] = []
    build_retrying(scripted_caller(plain_seen), None, plain_retries).run_sync("go")

    durable_seen: list[list[tuple[str, Any]]] = []
    durable_retries: list[int] = []
    source = build_retrying(scripted_caller(durable_seen), f"pai_retry_{next(_names)}", durable_retries)
    assert run_durable(threads, source) == "done"

    assert durable_retries == plain_retries == [1, 2]  # the first call never ran: its arguments failed
    kinds = [[kind for kind, _ in turn] for turn in durable_seen]
    assert kinds == [[kind for kind, _ in turn] for turn in plain_seen] == [["retry"], ["retry"], ["return"]]
    assert durable_seen[1] == plain_seen[1] == [("retry", "use the code 'ok'")]
    # Invalid arguments: Pydantic AI shows the model pydantic's error list, values included; here the
    # description names the field and the problem without the values (they may hold a secret).
    assert "code" in durable_seen[0][0][1] and "valid string" in durable_seen[0][0][1]
    assert durable_seen[2] == plain_seen[2] == [("return", {"code": "ok", "found": True})]


def test_a_testmodel_run_sees_the_returned_objects_as_plain_pydantic_ai_does(threads: Threads) -> None:
    def build(name: str | None) -> PydanticAgent[None, str]:
        agent = PydanticAgent(TestModel(), name=name)

        @agent.tool_plain
        def get_lat_lng(location: str) -> dict[str, float]:
            """Where a place is."""
            return {"lat": 51.5, "lng": -0.1}

        @agent.tool_plain
        def get_name() -> str:
            """A plain string result."""
            return "London"

        return agent

    expected = build(None).run_sync("go").output
    assert run_durable(threads, build(f"pai_objects_{next(_names)}")) == expected
    assert '{"lat":51.5' in expected.replace(" ", "")  # the object, not its JSON text escaped again


def test_a_tool_retried_past_its_limit_ends_the_run_as_in_pydantic_ai(threads: Threads) -> None:
    def build(model: FunctionModel, name: str | None) -> PydanticAgent[None, str]:
        agent = PydanticAgent(model, name=name, retries=2)

        @agent.tool_plain
        def stubborn(word: str) -> str:
            """Never happy."""
            raise ModelRetry(f"not {word!r}")

        return agent

    def always_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("stubborn", {"word": "again"})])

    try:
        build(FunctionModel(always_calls), None).run_sync("go")
        raise AssertionError("plain Pydantic AI should have stopped the run")
    except Exception as exc:  # noqa: BLE001 - pydantic_ai's UnexpectedModelBehavior
        plain_error = str(exc)
    agent = from_pydantic_ai(
        build(FunctionModel(always_calls), f"pai_limit_{next(_names)}"), permissions=Permissions.allow_all()
    )
    handle = threads.start(agent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert plain_error.startswith("Tool 'stubborn' exceeded max retries count of 2")
    assert run.status == "error" and run.error is not None and "exceeded max retries count of 2" in run.error
    tries = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert len(tries) == 3  # two retries allowed, the third failure ends it (as many calls as Pydantic AI makes)
