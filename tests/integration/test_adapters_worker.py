"""MCP tools and adapted Pydantic AI agents on a real prefork worker, PostgreSQL and Redis.

The worker loads tests/support/pydantic_ai_agents.py and tests/integration/mcp_worker_agents.py:
it builds the tools' dependencies itself (by the factory's import path) and starts the MCP test
server over stdio for each call. Only ids travel through the broker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_servers import ledger_lines

pytestmark = pytest.mark.integration

WAIT_S = 90.0
WORKER_AGENTS = "tests.support.pydantic_ai_agents,tests.integration.mcp_worker_agents"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("mcp") / "effects.log"
    saved = os.environ.get("MCP_TEST_LEDGER")
    os.environ["MCP_TEST_LEDGER"] = str(path)  # the worker inherits it; so do the agents' modules
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("MCP_TEST_LEDGER", None)
        else:
            os.environ["MCP_TEST_LEDGER"] = saved


@pytest.fixture(scope="module")
def worker_agents(ledger: Path) -> str:
    return WORKER_AGENTS


@pytest.fixture(scope="module")
def client(threads: Any) -> Any:
    from tests.integration import mcp_worker_agents
    from tests.support import pydantic_ai_agents

    for agent in (
        pydantic_ai_agents.durable_weather,
        pydantic_ai_agents.durable_reporter,
        pydantic_ai_agents.broken_weather,
        mcp_worker_agents.mcp_notes,
        mcp_worker_agents.mcp_dies,
    ):
        threads.register(agent)
    return threads


def test_an_adapted_agent_runs_on_the_worker_with_its_deps_and_output_type(client: Any) -> None:
    from tests.support.pydantic_ai_agents import Forecast, durable_weather

    handle = client.start("pai_weather", "Weather in Paris?")
    run = client.wait(handle.run_id, WAIT_S)
    assert run.status == "awaiting_approval", run.error
    [pending] = [p for p in client.parked() if p.run_id == handle.run_id]
    assert pending.tool == "book_trip"  # no stated effect: it asks first
    client.approve(pending.effect_key, principal="tester")
    run = client.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert isinstance(durable_weather.parse_output(run.output), Forecast)
    results = [m.tool_result for m in client.messages(handle.thread_id) if m.tool_result is not None]
    assert (results[0].name, results[0].content) == (
        "temperature",
        "21",
    )  # deps built in the worker


def test_instructions_and_settings_carry_over_on_the_worker(client: Any) -> None:
    import json

    run = client.wait(client.start("pai_reporter", "Look up alpha").run_id, WAIT_S)
    assert run.status == "completed", run.error
    seen = json.loads(run.output)
    # Built from the worker's dependencies, and sent as the request's instructions (as Pydantic AI does).
    assert seen["system"] == ["You are a careful assistant."]
    assert "Report temperatures in C." in seen["instructions"]
    assert seen["settings"] == {"temperature": 0.25, "max_tokens": 321}


def test_deps_that_cannot_be_built_on_the_worker_fail_the_run_at_its_first_step(
    client: Any,
) -> None:
    handle = client.start("pai_weather_broken", "Weather?")
    run = client.wait(handle.run_id, WAIT_S)
    assert run.status == "error"
    assert "broken_deps raised ConnectionError" in (run.error or "")
    assert [m.role for m in client.messages(handle.thread_id)] == ["user"]


def test_mcp_calls_run_on_the_worker_each_with_its_effect_key_and_permission_check(client: Any, ledger: Path) -> None:
    handle = client.start("mcp_worker_notes", "Tell Gus about Oslo")
    run = client.wait(handle.run_id, WAIT_S)
    assert run.status == "awaiting_approval", run.error
    [pending] = [p for p in client.parked() if p.run_id == handle.run_id]
    assert pending.tool == "send_note"
    assert "send_note gus: from a worker" not in ledger_lines(ledger)
    client.approve(pending.effect_key, principal="tester")
    run = client.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    results = [m.tool_result for m in client.messages(handle.thread_id) if m.tool_result is not None]
    assert [r.content for r in results] == ["Oslo: 2100000 people", "sent to gus"]
    keys = [c.effect_key for m in client.messages(handle.thread_id) for c in m.tool_calls]
    assert len(set(keys)) == 2 and pending.effect_key in keys
    assert ledger_lines(ledger).count("send_note gus: from a worker") == 1


def test_an_mcp_server_dying_mid_call_parks_the_unguarded_call_on_the_worker(client: Any, ledger: Path) -> None:
    handle = client.start("mcp_worker_dies", "Message Hal")
    run = client.wait(handle.run_id, WAIT_S)
    assert run.status == "parked"
    [pending] = [p for p in client.parked() if p.run_id == handle.run_id]
    assert "whether the tool acted is unknown" in pending.reason
    assert ledger_lines(ledger).count("die_after_sending hal") == 1
