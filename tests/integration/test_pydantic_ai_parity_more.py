"""The same Pydantic AI agents plainly and on a real prefork worker (PostgreSQL, Redis).

The worker loads tests/integration/parity_worker_agents.py, whose agents log what their model
saw and what their code ran to files; the test runs the same recipes with ``run_sync`` in this
process and compares: ``ctx.run_step`` in a prepare function, instructions and a tool (the tool
is hidden from the second request), an output validator run once per output (also past the
output retries), and a function tool called beside the output call run under the default end
strategy, and a tool that reads ``ctx.usage`` and runs a delegate agent with ``usage=ctx.usage``
(its requests are the run's). tests/unit/definitions/test_pydantic_ai_parity_units.py and
test_pydantic_ai_usage_parity.py cover every case on the embedded runtime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import parity_worker_agents as recipes

pytestmark = pytest.mark.integration

WAIT_S = 90.0


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("parity-logs")
    saved = os.environ.get("PARITY_LOG_DIR")
    os.environ["PARITY_LOG_DIR"] = str(folder)  # the worker inherits it
    try:
        yield folder
    finally:
        if saved is None:
            os.environ.pop("PARITY_LOG_DIR", None)
        else:
            os.environ["PARITY_LOG_DIR"] = saved


@pytest.fixture(scope="module")
def worker_agents(log_dir: Path) -> str:
    return "tests.integration.parity_worker_agents"


@pytest.fixture(scope="module")
def client(threads: Any) -> Any:
    for agent in (
        recipes.durable_run_step,
        recipes.durable_sql,
        recipes.durable_sql_invalid,
        recipes.durable_strategy,
        recipes.durable_delegating,
    ):
        threads.register(agent)
    return threads


def as_json(values: list[Any]) -> list[Any]:
    return [json.loads(json.dumps(v)) for v in values]


def durable_run(client: Any, agent: Any) -> tuple[str, Any]:
    run = client.wait(client.start(agent.name, "go").run_id, WAIT_S)
    if run.status == "completed":
        return ("output", agent.parse_output(run.output))
    return ("error", run.error or run.status)


def plain_run(agent: Any) -> tuple[str, Any]:
    try:
        return ("output", agent.run_sync("go").output)
    except Exception as exc:  # noqa: BLE001 - Pydantic AI's own way of ending a run
        return ("error", str(exc))


def test_run_step_hides_a_prepared_tool_on_the_second_request_on_the_worker(client: Any, log_dir: Path) -> None:
    plain_log = recipes.Log()
    plain = plain_run(recipes.run_step_agent(plain_log))
    assert durable_run(client, recipes.durable_run_step) == plain == ("output", "done")
    assert recipes.read(log_dir, "run_step", "offered") == plain_log.offered == [["lookup"], []]
    assert recipes.read(log_dir, "run_step", "ran") == as_json(plain_log.ran)
    assert recipes.read(log_dir, "run_step", "seen") == as_json(plain_log.seen)


@pytest.mark.parametrize(("name", "always_invalid"), [("sql", False), ("sql_invalid", True)])
def test_the_output_validator_runs_as_often_as_plainly_on_the_worker(
    client: Any, log_dir: Path, name: str, always_invalid: bool
) -> None:
    plain_log = recipes.Log()
    plain = plain_run(recipes.sql_agent(plain_log, always_invalid))
    durable = durable_run(client, recipes.durable_sql_invalid if always_invalid else recipes.durable_sql)
    assert durable == plain
    assert recipes.read(log_dir, name, "ran") == as_json(plain_log.ran)
    assert len(plain_log.ran) == 2  # [nosuch, users], or [nosuch, nosuch] and the retries exceeded
    assert recipes.read(log_dir, name, "seen") == as_json(plain_log.seen)


def test_a_tool_beside_the_output_call_runs_on_the_worker(client: Any, log_dir: Path) -> None:
    plain_log = recipes.Log()
    plain = plain_run(recipes.strategy_agent(plain_log))
    assert durable_run(client, recipes.durable_strategy) == plain == ("output", recipes.Query(sql="SELECT 1"))
    assert recipes.read(log_dir, "strategy", "ran") == as_json(plain_log.ran) == [["note", "beside", 1]]


def test_a_delegate_run_with_ctx_usage_is_the_runs_usage_on_the_worker(client: Any, log_dir: Path) -> None:
    plain_log = recipes.Log()
    plain = recipes.delegating_agent(plain_log).run_sync("go")
    run = client.wait(client.start(recipes.durable_delegating.name, "go").run_id, WAIT_S)
    assert run.status == "completed" and recipes.durable_delegating.parse_output(run.output) == plain.output
    assert recipes.read(log_dir, "delegating", "ran") == as_json(plain_log.ran) == [["search", "LIS-BER", 1, 0]]
    used = client.usage(run_id=run.id)
    assert plain.usage.requests == 4 and used.requests == plain.usage.requests
    assert (used.input_tokens, used.output_tokens) == (plain.usage.input_tokens, plain.usage.output_tokens)
