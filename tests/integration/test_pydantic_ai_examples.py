"""The official ``pydantic-ai-examples`` agents, side by side: plain Pydantic AI against from_pydantic_ai.

Each agent is the example module's own, unchanged; each side runs it on the same Pydantic AI
``TestModel`` (which calls every tool, then answers from what they returned) with the same
dependencies, the durable side on the embedded runtime. They must end the same way: the same
output, or the same error.

- bank_support: an async instruction function, an async tool, a structured output, ``Caching()``;
- flight_booking: a union output with one tool per member, an output validator that answers
  ``ModelRetry`` (TestModel's made-up flight never satisfies it: both runs stop at the retry
  limit), a tool that runs another agent, ``Caching()``; its seat preference agent (a union);
- weather_agent: async tools over an HTTP client (answering from a table), instructions, a plain
  text answer;
- pydantic_model: a structured output without tools.

The package is installed into the session's own folder from the package registry (its pins are
for an older Pydantic AI and its dependencies are for other examples): skipped when the registry
cannot be reached, failed under ``CI=true``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.models.test import TestModel

from tests.support import pai_examples
from threads_celery import Permissions, Settings, Threads, from_pydantic_ai

WAIT_S = 60.0
_names = itertools.count()


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    target = tmp_path_factory.mktemp("pydantic-ai-examples")
    try:
        pai_examples.install(target)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        why = f"pydantic-ai-examples=={pai_examples.VERSION} could not be installed: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return pai_examples.load(target)


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded(settings=Settings(model_retries=0)) as runtime:
        yield runtime


def side_by_side(
    threads: Threads, agent: Any, prompt: str, deps: str | None
) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """(how plain Pydantic AI ended, how the durable run ended): ("output", value) or ("error", text)."""
    factory = getattr(pai_examples, deps.rsplit(":", 1)[1]) if deps else None
    try:
        plain: tuple[str, Any] = (
            "output",
            agent.run_sync(prompt, model=TestModel(), deps=factory() if factory else None).output,
        )
    except Exception as exc:  # noqa: BLE001 - Pydantic AI's own way of ending a run
        plain = ("error", str(exc))
    durable = from_pydantic_ai(
        agent, name=f"example_{next(_names)}", model=TestModel(), deps=deps, permissions=Permissions.allow_all()
    )
    run = threads.wait(threads.start(durable, prompt).run_id, WAIT_S)
    if run.status == "completed":
        return plain, ("output", durable.parse_output(run.output))
    return plain, ("error", run.error or run.status)


def test_bank_support(examples: dict[str, Any], threads: Threads) -> None:
    agent = examples["bank_support"].support_agent
    plain, durable = side_by_side(threads, agent, "What is my balance?", "tests.support.pai_examples:bank_deps")
    assert plain[0] == "output" and durable == plain


def test_flight_search_stops_at_the_validators_retry_limit_as_plain_pydantic_ai_does(
    examples: dict[str, Any], threads: Threads
) -> None:
    flights = examples["flight_booking"]
    flights.extraction_agent.model = TestModel()  # the tool's own agent: never a provider here
    plain, durable = side_by_side(
        threads, flights.search_agent, "Find me a flight", "tests.support.pai_examples:flight_deps"
    )
    assert durable == plain


def test_seat_preference(examples: dict[str, Any], threads: Threads) -> None:
    plain, durable = side_by_side(threads, examples["flight_booking"].seat_preference_agent, "Window seat, row 1", None)
    assert plain[0] == "output" and durable == plain


def test_weather_agent(examples: dict[str, Any], threads: Threads) -> None:
    agent = examples["weather_agent"].weather_agent
    plain, durable = side_by_side(
        threads, agent, "What is the weather like in London?", "tests.support.pai_examples:weather_deps"
    )
    assert plain[0] == "output" and durable == plain
    assert "51.5" in plain[1] and "Sunny" in plain[1]  # the tools' answers, as objects, in TestModel's reply


def test_pydantic_model(examples: dict[str, Any], threads: Threads) -> None:
    plain, durable = side_by_side(threads, examples["pydantic_model"].agent, "The windy city in the US of A.", None)
    assert plain[0] == "output" and durable == plain


@pytest.mark.parametrize("module", pai_examples.MODULES)
def test_every_agent_of_the_module_carries_over(examples: dict[str, Any], module: str) -> None:
    from pydantic_ai import Agent as PydanticAgent

    agents = [v for v in vars(examples[module]).values() if isinstance(v, PydanticAgent)]
    assert agents
    for agent in agents:
        deps = {
            "bank_support": "tests.support.pai_examples:bank_deps",
            "weather_agent": "tests.support.pai_examples:weather_deps",
        }
        needs = module == "flight_booking" and agent is examples[module].search_agent
        from_pydantic_ai(
            agent,
            name=f"example_{next(_names)}",
            model=TestModel(),
            deps=deps.get(module) or ("tests.support.pai_examples:flight_deps" if needs else None),
        )


def test_the_package_installs_into_the_sessions_own_folder(examples: dict[str, Any]) -> None:
    path = Path(examples["bank_support"].__file__)
    assert "pydantic-ai-examples" in str(path) and ".venv" not in str(path)
