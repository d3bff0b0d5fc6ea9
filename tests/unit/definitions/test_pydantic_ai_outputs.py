"""Every output type, side by side: plain Pydantic AI and from_pydantic_ai on the same FunctionModel.

For each output spec, one model function answers both runs: it records the output tools it is
offered (name, description, schema) and calls the one the case names with the case's arguments.
The two runs must offer the same tools and end with the same output value. Output specs that
cannot be durable are a ConfigError naming the output type.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry, NativeOutput, PromptedOutput, RunContext, ToolOutput
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typing_extensions import TypedDict

from threads_celery import ConfigError, Threads, from_pydantic_ai

WAIT_S = 30.0
_names = itertools.count()


class FlightDetails(BaseModel):
    """Details of the most suitable flight."""

    flight_number: str
    price: int


class Failed(BaseModel):
    """Unable to find a satisfactory choice."""


class Range(TypedDict):
    start: int
    end: int


CASES: list[tuple[str, Any, str, dict[str, Any]]] = [
    ("one model", FlightDetails, "final_result", {"flight_number": "AK456", "price": 80}),
    (
        "a list of models",
        list[FlightDetails],
        "final_result",
        {"response": [{"flight_number": "AK456", "price": 80}, {"flight_number": "NZ1", "price": 95}]},
    ),
    (
        "a union, first member",
        FlightDetails | Failed,
        "final_result_FlightDetails",
        {"flight_number": "X1", "price": 1},
    ),
    ("a union, second member", FlightDetails | Failed, "final_result_Failed", {}),
    ("an int", int, "final_result", {"response": 42}),
    ("a dict", dict[str, int], "final_result", {"response": {"a": 1, "b": 2}}),
    ("a TypedDict", Range, "final_result", {"start": 1, "end": 9}),
    ("a ToolOutput", ToolOutput(FlightDetails, name="pick_flight"), "pick_flight", {"flight_number": "Q", "price": 3}),
]


def scripted(tool_name: str, args: dict[str, Any], offered: list[Any]) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.append(sorted((t.name, t.description, t.parameters_json_schema) for t in info.output_tools))
        return ModelResponse(parts=[ToolCallPart(tool_name, dict(args))])

    return FunctionModel(answer)


@pytest.mark.parametrize(("case", "output_type", "tool_name", "args"), CASES, ids=[c[0] for c in CASES])
def test_the_output_is_offered_and_read_as_pydantic_ai_does(
    threads: Threads, case: str, output_type: Any, tool_name: str, args: dict[str, Any]
) -> None:
    plain_offered: list[Any] = []
    plain = PydanticAgent(scripted(tool_name, args, plain_offered), output_type=output_type)
    expected = plain.run_sync("Find me a flight").output

    durable_offered: list[Any] = []
    source = PydanticAgent(
        scripted(tool_name, args, durable_offered), output_type=output_type, name=f"pai_out_{next(_names)}"
    )
    agent = from_pydantic_ai(source)
    handle = threads.start(agent, "Find me a flight")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert agent.parse_output(run.output) == expected
    assert durable_offered == plain_offered
    assert plain_offered[0], "the model was offered output tools"


def test_a_union_offers_one_output_tool_per_member_with_its_docstring() -> None:
    agent = from_pydantic_ai(
        PydanticAgent(FunctionModel(lambda m, i: None), output_type=FlightDetails | Failed, name="u")
    )  # type: ignore[arg-type, return-value]
    outputs = {t.name: t.description for t in agent.tools}
    assert outputs == {
        "final_result_FlightDetails": "Details of the most suitable flight.",
        "final_result_Failed": "Unable to find a satisfactory choice.",
    }


def test_an_invalid_output_call_goes_back_to_the_model_which_can_try_again(threads: Threads) -> None:
    turns: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turns.append(len(messages))
        args: dict[str, Any] = {"response": [{"flight_number": "AK1"}]}  # no price
        if len(turns) > 1:
            args = {"response": [{"flight_number": "AK1", "price": 5}]}
        return ModelResponse(parts=[ToolCallPart("final_result", args)])

    agent = from_pydantic_ai(PydanticAgent(FunctionModel(answer), output_type=list[FlightDetails], name="retry_out"))
    handle = threads.start(agent, "Find me a flight")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert agent.parse_output(run.output) == [FlightDetails(flight_number="AK1", price=5)]
    [refused] = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert refused.is_error and "price" in refused.content


@pytest.mark.parametrize(
    "output_type",
    [NativeOutput(FlightDetails), PromptedOutput(FlightDetails), [FlightDetails, str]],
    ids=["NativeOutput", "PromptedOutput", "text besides"],
)
def test_output_specs_that_cannot_be_durable_are_a_config_error(output_type: Any) -> None:
    source = PydanticAgent(FunctionModel(lambda m, i: None), output_type=output_type, name="refused")  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match="output_type="):
        from_pydantic_ai(source)


def test_output_validators_run_in_the_worker_and_their_model_retry_goes_back_to_the_model(
    threads: Threads,
) -> None:
    def build(model: FunctionModel, name: str | None) -> PydanticAgent[None, FlightDetails]:
        agent = PydanticAgent(model, output_type=FlightDetails, name=name)

        @agent.output_validator
        async def affordable(ctx: RunContext[None], output: FlightDetails) -> FlightDetails:
            if output.price > 100:
                raise ModelRetry(f"{output.flight_number} costs too much; find one under 100")
            return output.model_copy(update={"flight_number": output.flight_number.upper()})

        return agent

    def model(seen: list[Any]) -> FunctionModel:
        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            retried = [
                p.content for m in messages for p in getattr(m, "parts", ()) if getattr(p, "outcome", "") == "retried"
            ]
            seen.append(retried)
            price = 500 if not retried else 50
            return ModelResponse(parts=[ToolCallPart("final_result", {"flight_number": "ak1", "price": price})])

        return FunctionModel(answer)

    plain_seen: list[Any] = []
    expected = build(model(plain_seen), None).run_sync("go").output
    durable_seen: list[Any] = []
    agent = from_pydantic_ai(build(model(durable_seen), f"pai_validated_{next(_names)}"))
    run = threads.wait(threads.start(agent, "go").run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert agent.parse_output(run.output) == expected == FlightDetails(flight_number="AK1", price=50)
    assert durable_seen == plain_seen == [[], ["ak1 costs too much; find one under 100"]]
