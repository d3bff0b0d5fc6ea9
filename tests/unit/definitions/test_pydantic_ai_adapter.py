"""from_pydantic_ai: an existing Pydantic AI agent, made durable, run on the embedded runtime.

Driven by Pydantic AI's own TestModel and FunctionModel (tests/support/pydantic_ai_agents.py).
A real worker on PostgreSQL and Redis runs the same agents in
tests/integration/test_adapters_worker.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import FunctionToolset

from tests.support import pydantic_ai_agents as pai
from threads_celery import Agent, ConfigError, Threads, from_pydantic_ai
from threads_celery.definitions.pydantic_ai_adapter import PydanticAIAgent, factory_reference

WAIT_S = 30.0


def test_the_adapter_returns_an_agent_with_the_tools_and_their_stated_effects() -> None:
    agent = pai.durable_weather
    assert isinstance(agent, Agent) and isinstance(agent, PydanticAIAgent)
    assert agent.name == "pai_weather"
    effects = {t.name: t.effect for t in agent.tools}
    # temperature was stated read_only; book_trip was not stated, so it is unguarded.
    assert effects == {
        "temperature": "read_only",
        "book_trip": "unguarded",
        "final_result": "read_only",
    }
    assert agent.deps_factory == "tests.support.pydantic_ai_agents:make_weather_deps"
    assert agent.output_type is pai.Forecast


def test_a_testmodel_run_asks_before_the_unstated_tool_and_ends_with_the_output_type(
    threads: Threads,
) -> None:
    handle = threads.start(pai.durable_weather, "What is the weather in Paris?")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "awaiting_approval"
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert pending.tool == "book_trip"
    results = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert [(r.name, r.content) for r in results] == [("temperature", "21")]  # 11 + the worker's deps
    threads.approve(pending.effect_key, principal="tester")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    forecast = pai.durable_weather.parse_output(run.output)
    assert isinstance(forecast, pai.Forecast)
    results = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert [r.name for r in results] == ["temperature", "book_trip"]


def test_instructions_tools_and_model_settings_reach_the_model(threads: Threads) -> None:
    handle = threads.start(pai.durable_reporter, "Look up alpha")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    seen = json.loads(run.output or "")
    # As Pydantic AI sends them: the system prompt as a system prompt part, the instructions as the
    # request's instructions (a RunContext instruction built from the worker's dependencies).
    assert seen["system"] == ["You are a careful assistant."]
    assert seen["instructions"] == "Use the lookup tool.\n\nReport temperatures in C."
    plain = json.loads(pai.reporter.run_sync("Look up alpha", deps=pai.make_weather_deps()).output)
    assert (plain["system"], plain["instructions"]) == (seen["system"], seen["instructions"])
    assert seen["settings"] == {"temperature": 0.25, "max_tokens": 321}
    assert seen["tools"] == ["lookup"]
    schema = seen["lookup_schema"]
    assert schema["required"] == ["key"] and schema["properties"]["limit"]["description"] == "How many results at most."
    assert seen["allow_text_output"] is True
    # The tool got its dependencies and the call's effect key as its tool_call_id.
    [call] = [c for m in threads.messages(handle.thread_id) for c in m.tool_calls]
    assert seen["returned"] == [f"alpha:3:10:{call.effect_key}"]


def test_output_that_fails_the_output_type_goes_back_to_the_model(threads: Threads) -> None:
    handle = threads.start(pai.durable_fussy, "Forecast for Rome")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert pai.durable_fussy.parse_output(run.output) == pai.Forecast(city="Rome", temperature=24)
    [rejected] = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert rejected.is_error and "temperature" in rejected.content


def test_model_retry_from_a_tool_is_the_retry_the_model_sees(threads: Threads) -> None:
    handle = threads.start(pai.durable_picky, "Be polite")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert run.output == "the tool said: say please"  # as Pydantic AI shows it: the message itself
    [retried] = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert retried.is_error and retried.kind == "retry"


def test_dependencies_that_cannot_be_built_fail_the_run_at_its_first_step(threads: Threads) -> None:
    handle = threads.start(pai.broken_weather, "Weather?")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "error"
    assert run.error is not None
    assert "cannot run in this worker" in run.error
    assert "tests.support.pydantic_ai_agents:broken_deps raised ConnectionError" in run.error
    assert [m.role for m in threads.messages(handle.thread_id)] == ["user"]  # no model turn, no call


def test_a_factory_path_that_does_not_import_fails_the_run_with_a_clear_error(
    threads: Threads,
) -> None:
    agent = from_pydantic_ai(
        pai.weather,
        name="pai_weather_missing_factory",
        effects={"temperature": "read_only"},
        deps="no_such_module:make",
    )
    run = threads.wait(threads.start(agent, "Weather?").run_id, WAIT_S)
    assert run.status == "error"
    assert run.error is not None and "'no_such_module:make' cannot be imported in this worker" in run.error


def test_requires_approval_asks_first_whatever_the_stated_effect(threads: Threads) -> None:
    source = PydanticAgent(TestModel(), name="pai_approval")

    @source.tool_plain(requires_approval=True)
    def peek(path: str) -> str:
        """Read a file."""
        return "contents"

    agent = from_pydantic_ai(source, effects={"peek": "read_only"})
    run = threads.wait(threads.start(agent, "Peek").run_id, WAIT_S)
    assert run.status == "awaiting_approval"


def test_a_model_string_needs_no_provider_credentials_to_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    source = PydanticAgent("openai:gpt-4o-mini", name="pai_string_model", defer_model_check=True)
    agent = from_pydantic_ai(source)
    assert agent.model_identity() == "openai:gpt-4o-mini"
    assert agent.config_hash()


# -- what is refused, clearly ----------------------------------------------------------------------


def test_a_deps_type_without_a_factory_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="deps_type=WeatherDeps; pass deps="):
        from_pydantic_ai(pai.weather, name="x")


def test_a_lambda_factory_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot be imported by name in a worker"):
        from_pydantic_ai(pai.weather, name="x", deps=lambda: pai.WeatherDeps(1, "C"))
    assert factory_reference("a", pai.make_nothing) == "tests.support.pydantic_ai_agents:make_nothing"


def test_effects_for_unknown_tools_and_idempotent_without_a_window_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="no tool of"):
        from_pydantic_ai(pai.weather, deps=pai.make_weather_deps, effects={"temprature": "read_only"})
    with pytest.raises(ConfigError, match="dedup_window_ms"):
        from_pydantic_ai(pai.weather, deps=pai.make_weather_deps, effects={"book_trip": "idempotent"})
    agent = from_pydantic_ai(
        pai.weather,
        deps=pai.make_weather_deps,
        effects={"book_trip": "idempotent"},
        dedup_window_ms={"book_trip": 900},
    )
    [book] = [t for t in agent.tools if t.name == "book_trip"]
    assert (book.effect, book.dedup_window_ms) == ("idempotent", 900)


def test_what_does_not_carry_over_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="toolsets"):
        from_pydantic_ai(PydanticAgent(TestModel(), name="ts", toolsets=[FunctionToolset()]))
    with pytest.raises(ConfigError, match=r"pydantic_ai\.Agent"):
        from_pydantic_ai(object())
    with pytest.raises(ConfigError, match="no name"):
        from_pydantic_ai(PydanticAgent(TestModel()))
    with pytest.raises(ConfigError, match="output_type"):
        from_pydantic_ai(PydanticAgent(TestModel(), name="multi", output_type=[int, str]))


def test_the_example_agent_runs_with_its_effects(
    threads: Threads, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = tmp_path / "shop.jsonl"
    monkeypatch.setenv("SHOP_OUTBOX", str(outbox))
    from examples.pydantic_ai_agent import SupportReply, agent

    effects = {t.name: (t.effect, t.dedup_window_ms) for t in agent.tools if t.name != "final_result"}
    assert effects == {
        "lookup_order": ("read_only", None),
        "refund_order": ("idempotent", 86_400_000),
        "email_customer": ("unguarded", None),
    }
    handle = threads.start(agent, "Order 42 arrived broken")
    asked = []
    while (run := threads.wait(handle.run_id, WAIT_S)).status == "awaiting_approval":
        [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
        asked.append(pending.tool)
        threads.approve(pending.effect_key, principal="tester")
    assert run.status == "completed", run.error
    assert asked == ["refund_order", "email_customer"]  # read_only ran freely; the rest asked first
    assert agent.parse_output(run.output).refunded is True
    assert isinstance(agent.parse_output(run.output), SupportReply)
    records = [json.loads(line) for line in outbox.read_text().splitlines()]
    refund_key = next(
        c.effect_key for m in threads.messages(handle.thread_id) for c in m.tool_calls if c.name == "refund_order"
    )
    assert [r["kind"] for r in records] == ["refund", "email"]
    assert records[0]["idempotency_key"] == refund_key


def test_a_worker_checks_an_adapted_agents_model_string_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from threads_celery.runtime.preflight import check_models

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    agent = from_pydantic_ai(
        PydanticAgent("openai:gpt-4o-mini-preflight", name="pai_preflight", defer_model_check=True)
    )
    with pytest.raises(ConfigError, match=r"agent 'pai_preflight': model .* cannot be used"):
        check_models([agent])
