"""A model string whose provider package is not installed stops at once, in one line naming the
extra to install, at every entry point: ``Threads.start`` embedded, the CLI's ``run``, the HTTP
API's ``POST /v1/runs``, and a worker that meets such a run (it ends the run at its first step,
without retrying). So does one whose provider cannot be built here for want of its API key.

The test environment has no ``anthropic`` package (the ``test`` extra installs only the openai
provider), so ``anthropic:...`` is a real missing package here, not a stand-in.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from threads_celery import Agent, Threads
from threads_celery.api.app import create_api
from threads_celery.exceptions import ModelUnavailable
from threads_celery.testing import start_worker

MODEL = "anthropic:claude-3-5-haiku-latest"
EXTRA = "pip install 'threads-celery[anthropic]'"
TOKEN = "missing-extra-token"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("anthropic") is not None, reason="the anthropic package is installed here"
)


def claude(name: str = "claude-agent") -> Agent:
    return Agent(name=name, instructions="Be brief.", model=MODEL)


@pytest.fixture
def threads(tmp_path: Path) -> Iterator[Threads]:
    with Threads.embedded(tmp_path / "embedded.db") as runtime:
        yield runtime


def test_embedded_start_refuses_at_once_naming_the_extra_and_records_nothing(threads: Threads) -> None:
    with pytest.raises(ModelUnavailable) as refused:
        threads.start(claude(), "hi")
    message = refused.value.message
    assert "\n" not in message and message.startswith(f"agent 'claude-agent': model {MODEL!r}"), message
    assert message.endswith(EXTRA), message
    assert threads.runs() == []
    # By name, once registered, the same.
    threads.registry.add(claude("by-name"))
    with pytest.raises(ModelUnavailable):
        threads.start("by-name", "hi")
    assert threads.runs() == []


def test_post_runs_answers_409_model_unavailable_not_500(threads: Threads) -> None:
    threads.register(claude())
    with TestClient(create_api(threads, tokens={TOKEN})) as client:
        response = client.post(
            "/v1/runs", json={"agent": "claude-agent", "message": "hi"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["type"] == "model_unavailable" and error["message"].endswith(EXTRA), error
    assert threads.runs() == []


def test_the_cli_run_stops_with_one_line_naming_the_extra(tmp_path: Path) -> None:
    (tmp_path / "claude_agent.py").write_text(
        f"from threads_celery import Agent\nagent = Agent(name='claude-agent', instructions='Hi.', model={MODEL!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "threads_celery.cli.app", "run", "claude_agent.py:agent", "hi"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "300", "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: agent 'claude-agent'") and lines[0].endswith(EXTRA), lines
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_worker_ends_such_a_run_at_its_first_step_with_that_reason(pg_url: str, redis_url: str) -> None:
    # A client of a broker does not check its own process (the workers have the packages), so the
    # run is recorded and the worker meets it.
    with Threads(database_url=pg_url, broker_url=redis_url) as threads:
        threads.migrate()
        threads.register(claude())
        with start_worker(threads, reconcile_interval=None):
            run = threads.wait(threads.start("claude-agent", "hi").run_id, timeout=30)
    assert run.status == "error", run
    assert run.error is not None and run.error.endswith(EXTRA) and "claude-agent" in run.error, run.error
    # Not retried: a step that gives up after its retries says "failed after N attempts".
    assert "attempts" not in run.error and "cannot run in this worker" in run.error, run.error


# -- a provider that cannot be built: no API key -----------------------------------------------

KEYLESS = "openai:gpt-4o-mini"


def keyless(name: str = "keyless-agent") -> Agent:
    return Agent(name=name, instructions="Be brief.", model=KEYLESS)


@pytest.fixture
def no_openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_openai_key")
def test_embedded_start_without_the_providers_key_refuses_at_once_naming_it(threads: Threads) -> None:
    with pytest.raises(ModelUnavailable) as refused:
        threads.start(keyless(), "hi")
    message = refused.value.message
    assert "\n" not in message and message.startswith(f"agent 'keyless-agent': model {KEYLESS!r}"), message
    assert "OPENAI_API_KEY" in message, message
    assert threads.runs() == []


@pytest.mark.usefixtures("no_openai_key")
def test_a_worker_without_the_providers_key_ends_the_run_at_its_first_step(pg_url: str, redis_url: str) -> None:
    with Threads(database_url=pg_url, broker_url=redis_url) as threads:
        threads.migrate()
        threads.register(keyless())
        with start_worker(threads, reconcile_interval=None):
            handle = threads.start("keyless-agent", "hi")
            run = threads.wait(handle.run_id, timeout=30)
    assert run.status == "error", run
    assert run.error is not None and "OPENAI_API_KEY" in run.error and "cannot run in this worker" in run.error
    # Not retried: a step that gives up after its retries says "failed after N attempts".
    assert "attempt" not in run.error, run.error
