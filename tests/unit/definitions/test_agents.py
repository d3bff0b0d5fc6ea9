"""Agent definitions, the config fingerprint a thread is pinned to, and the agent registry."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from threads_celery import Agent, tool
from threads_celery.definitions.agents import AgentRegistry, import_agents
from threads_celery.exceptions import ConfigError, UnknownAgent
from threads_celery.testing import ScriptedModel, say


class CityIn(BaseModel):
    city: str


def weather_tool(description: str = "Get the weather.", **overrides: Any) -> Any:
    options: dict[str, Any] = {
        "name": "get_weather",
        "description": description,
        "input": CityIn,
        "execute": lambda inp, ctx: "sunny",
        "effect": "read_only",
    }
    options.update(overrides)
    return tool(**options)


def clock_tool() -> Any:
    return tool(name="get_time", description="Get the time.", input=CityIn, execute=lambda inp, ctx: "noon")


def model() -> ScriptedModel:
    return ScriptedModel([say("hello")])


def make(**overrides: Any) -> Agent:
    options: dict[str, Any] = {
        "name": "weather",
        "instructions": "You report the weather.",
        "model": model(),
        "tools": [weather_tool()],
    }
    options.update(overrides)
    return Agent(**options)


# -- validation -------------------------------------------------------------------------------


def test_an_agent_without_a_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="agent 'weather' needs a model"):
        Agent(name="weather", instructions="x", tools=[])


def test_duplicate_tool_names_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="two tools are named 'get_weather'"):
        make(tools=[weather_tool(), weather_tool(description="Another weather tool.")])


@pytest.mark.parametrize("name", ["", "1agent", "my agent", "agent/x", "_hidden", "a" * 129])
def test_a_bad_agent_name_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="is invalid"):
        make(name=name)


@pytest.mark.parametrize("name", ["weather", "Weather2", "support.triage", "billing-bot", "a_b"])
def test_good_agent_names_build(name: str) -> None:
    assert make(name=name).name == name


def test_tools_must_be_built_with_tool() -> None:
    with pytest.raises(ConfigError, match="tools must be built with tool"):
        make(tools=[lambda inp, ctx: "x"])


@pytest.mark.parametrize("max_steps", [0, -1, "10"])
def test_max_steps_must_be_a_positive_integer(max_steps: Any) -> None:
    with pytest.raises(ConfigError, match="max_steps must be a positive integer"):
        make(max_steps=max_steps)


def test_an_agent_finds_its_tools_by_name() -> None:
    agent = make(tools=[weather_tool(), clock_tool()])
    assert agent.tool_named("get_time") is agent.tools[1]
    assert agent.tool_named("nope") is None


def test_instructions_may_be_a_callable_evaluated_each_time() -> None:
    values = iter(["first", "second"])
    agent = make(instructions=lambda: next(values))
    assert agent.system_prompt() == "first"
    assert agent.system_prompt() == "second"


def test_a_model_string_is_its_own_identity() -> None:
    assert make(model="openai:gpt-4o-mini").model_identity() == "openai:gpt-4o-mini"


def test_describe_holds_no_code() -> None:
    description = make().describe()
    assert description == {
        "name": "weather",
        "model": make().model_identity(),
        "queue": None,
        "tools": [{"name": "get_weather", "effect": "read_only", "ends_turn": False, "queue": None}],
        "variables": {},
    }


# -- subclass style ---------------------------------------------------------------------------


def test_a_subclass_sets_its_configuration_as_class_attributes() -> None:
    scripted = model()

    class Forecaster(Agent):
        name = "forecaster"
        instructions = "You forecast."
        model = scripted
        tools = [weather_tool(), clock_tool()]  # noqa: RUF012 - an Agent subclass declares its tools as a class attribute
        max_steps = 7

        def on_progress(self, run: Any, progress: Any) -> None:  # a hook is just a method
            pass

    agent = Forecaster()
    assert agent.name == "forecaster"
    assert agent.system_prompt() == "You forecast."
    assert agent.model is scripted
    assert [t.name for t in agent.tools] == ["get_weather", "get_time"]
    assert agent.max_steps == 7
    assert agent.tool_named("get_time") is not None


def test_a_subclass_without_a_name_is_named_after_its_class() -> None:
    class Helpdesk(Agent):
        model = model()

    assert Helpdesk().name == "Helpdesk"


def test_keyword_arguments_override_class_attributes() -> None:
    class Base(Agent):
        name = "base"
        instructions = "base instructions"
        model = model()
        tools = [weather_tool()]  # noqa: RUF012 - an Agent subclass declares its tools as a class attribute

    agent = Base(name="other", instructions="other instructions", tools=[])
    assert (agent.name, agent.system_prompt(), agent.tools) == ("other", "other instructions", ())
    # The class keeps its own configuration.
    assert [t.name for t in Base().tools] == ["get_weather"]


def test_a_subclass_is_validated_too() -> None:
    class NoModel(Agent):
        name = "no_model"

    with pytest.raises(ConfigError, match="needs a model"):
        NoModel()

    class Duplicated(Agent):
        name = "duplicated"
        model = model()
        tools = [weather_tool(), weather_tool()]  # noqa: RUF012 - an Agent subclass declares its tools as a class attribute

    with pytest.raises(ConfigError, match="two tools are named"):
        Duplicated()


# -- config hash --------------------------------------------------------------------------------


def test_the_config_hash_is_stable_across_equal_definitions() -> None:
    assert make().config_hash() == make().config_hash()


def test_the_config_hash_ignores_what_is_not_configuration() -> None:
    base = make().config_hash()
    # Another implementation of the same tool, or other dependencies, keep the thread's pin.
    assert make(tools=[weather_tool(execute=lambda inp, ctx: "rainy")]).config_hash() == base
    assert make(deps={"db": object()}).config_hash() == base
    # The script is test data, not configuration: the model's identity is its name.
    assert make(model=ScriptedModel([say("something else")])).config_hash() == base


def test_the_config_hash_changes_when_the_tools_change() -> None:
    base = make().config_hash()
    assert make(tools=[]).config_hash() != base
    assert make(tools=[weather_tool(), clock_tool()]).config_hash() != base
    assert make(tools=[weather_tool(description="Get tomorrow's weather.")]).config_hash() != base
    assert make(tools=[weather_tool(effect="unguarded")]).config_hash() != base
    assert make(tools=[weather_tool(ends_turn=True)]).config_hash() != base


def test_the_config_hash_changes_when_the_instructions_change() -> None:
    assert make(instructions="You report the weather in Celsius.").config_hash() != make().config_hash()


def test_the_config_hash_changes_with_the_model_name_and_step_limit() -> None:
    base = make().config_hash()
    assert make(model=ScriptedModel([say("x")], model_name="other")).config_hash() != base
    assert make(model="openai:gpt-4o-mini").config_hash() != base
    assert make(max_steps=5).config_hash() != base
    assert make(name="weather2").config_hash() != base


# -- registry -------------------------------------------------------------------------------------


def test_the_registry_adds_and_gets_agents() -> None:
    registry = AgentRegistry()
    agent = make()
    assert registry.add(agent) is agent
    assert registry.get("weather") is agent
    assert "weather" in registry
    assert "other" not in registry
    assert list(registry) == [agent]


def test_an_unknown_agent_names_itself_and_what_is_loaded() -> None:
    registry = AgentRegistry()
    registry.add(make(name="alpha"))
    registry.add(make(name="beta"))
    with pytest.raises(UnknownAgent) as info:
        registry.get("gamma")
    message = str(info.value)
    assert "'gamma'" in message
    assert "loaded: alpha, beta" in message
    assert "THREADS_AGENTS" in message


def test_an_empty_registry_says_none_are_loaded() -> None:
    with pytest.raises(UnknownAgent, match=r"\(loaded: none\)"):
        AgentRegistry().get("weather")


def test_registering_the_same_configuration_again_is_allowed() -> None:
    registry = AgentRegistry()
    first, second = make(), make()
    registry.add(first)
    registry.add(first)
    registry.add(second)
    assert registry.get("weather") is second


def test_a_different_configuration_under_a_taken_name_is_a_config_error() -> None:
    registry = AgentRegistry()
    original = make()
    registry.add(original)
    with pytest.raises(ConfigError, match="'weather' is already registered with another configuration"):
        registry.add(make(instructions="Something else entirely."))
    assert registry.get("weather") is original


def test_only_agents_can_be_registered() -> None:
    with pytest.raises(ConfigError, match="can only register Agent instances"):
        AgentRegistry().add("weather")  # type: ignore[arg-type]


# -- importing agents by spec -----------------------------------------------------------------------


AGENT_MODULE = textwrap.dedent(
    """
    from threads_celery import Agent
    from threads_celery.testing import ScriptedModel, say

    first = Agent(name="first", instructions="one", model=ScriptedModel([say("1")]))
    second = Agent(name="second", instructions="two", model=ScriptedModel([say("2")]))
    not_an_agent = 42

    class Third(Agent):
        name = "third"
        model = ScriptedModel([say("3")])
    """
)


@pytest.fixture
def agent_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A unique package of agent modules on sys.path; yields the package name."""
    package = f"agents_pkg_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "defs.py").write_text(AGENT_MODULE)
    (root / "empty.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def test_import_agents_of_a_module_takes_every_top_level_agent(agent_modules: str) -> None:
    agents = import_agents(f"{agent_modules}.defs")
    assert sorted(a.name for a in agents) == ["first", "second"]


def test_import_agents_of_module_attr_takes_that_agent(agent_modules: str) -> None:
    [agent] = import_agents(f"{agent_modules}.defs:second")
    assert agent.name == "second"


def test_import_agents_of_an_agent_class_instantiates_it(agent_modules: str) -> None:
    [agent] = import_agents(f"{agent_modules}.defs:Third")
    assert isinstance(agent, Agent)
    assert agent.name == "third"


def test_import_agents_of_something_else_is_a_config_error(agent_modules: str) -> None:
    with pytest.raises(ConfigError, match=r"'not_an_agent' in module '.*defs' is not an Agent but of type"):
        import_agents(f"{agent_modules}.defs:not_an_agent")
    with pytest.raises(ConfigError, match=r"there is no attribute 'missing' in module '.*defs' \(the Agents it has: "):
        import_agents(f"{agent_modules}.defs:missing")


def test_import_agents_of_a_module_without_agents_is_a_config_error(agent_modules: str) -> None:
    with pytest.raises(ConfigError, match="defines no Agent at its top level"):
        import_agents(f"{agent_modules}.empty")


def test_import_agents_of_a_missing_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot import agent module 'no_such_module_for_threads'"):
        import_agents("no_such_module_for_threads")


def test_the_registry_loads_comma_separated_specs(agent_modules: str) -> None:
    registry = AgentRegistry()
    loaded = registry.load(f" {agent_modules}.defs:first , {agent_modules}.defs:Third,")
    assert [a.name for a in loaded] == ["first", "third"]
    assert "first" in registry and "third" in registry and "second" not in registry
