"""What the provider bills is what the run used: the same requests as plain Pydantic AI, on every
pool, and usage equal to the provider's ledger, a worker killed mid-request included.

The provider is :class:`threads_celery.testing.ProviderEmulator` over real HTTP; the agents name
their model by string (``openai:gpt-4o-mini`` with ``OPENAI_BASE_URL`` pointing at it), so the
real ``openai`` SDK client pydantic-ai builds from a string is what talks to it, in the worker
processes as in plain Pydantic AI. Ten runs at once on a thread pool once sent 13 to 18 requests
(one model object, and its HTTP client, shared by threads with an event loop each); a worker
killed after the provider answered left usage one request short of the bill.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import WorkerProcess
from tests.support import billing
from tests.support.clients import registered_client
from tests.support.processes import BeatProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery.records import UsageTotals
from threads_celery.testing import BilledRequest, ProviderEmulator

RUNS = 10
RUN_TIMEOUT_S = 90.0
BILLING_AGENTS = "tests.support.billing"


def _prompt(i: int) -> str:
    return f"Tell me about city{i}"


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    with ProviderEmulator(billing.provider_script) as emulator:
        monkeypatch.setenv("OPENAI_BASE_URL", emulator.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield emulator


@pytest.fixture(autouse=True)
def _fresh_models() -> Iterator[None]:
    """Model objects built from strings are cached: none may outlive the provider it points at."""
    from threads_celery.definitions.model_strings import forget_models

    forget_models()
    yield
    forget_models()


def _ledger_totals(billed: list[BilledRequest]) -> UsageTotals:
    return UsageTotals(
        requests=len(billed),
        input_tokens=sum(b.prompt_tokens for b in billed),
        output_tokens=sum(b.completion_tokens for b in billed),
    )


def _usage_of(threads: Any, run_ids: list[str]) -> UsageTotals:
    totals = [threads.usage(run_id=run_id) for run_id in run_ids]
    return UsageTotals(
        requests=sum(t.requests for t in totals),
        input_tokens=sum(t.input_tokens for t in totals),
        output_tokens=sum(t.output_tokens for t in totals),
    )


def _plain_requests(provider: ProviderEmulator, allow: None) -> int:
    """How many requests plain Pydantic AI makes for RUNS conversations (the ledger cleared after)."""
    plain = billing.plain_agent()
    for i in range(RUNS):
        result = plain.run_sync(_prompt(i))
        assert result.output.startswith("Found:"), result.output
    count = len(provider.billed)
    provider.billed.clear()
    return count


def _run_all(threads: Any) -> list[str]:
    handles = [threads.start(billing.durable_agent, _prompt(i)) for i in range(RUNS)]
    for handle in handles:
        run = threads.wait(handle.run_id, timeout=RUN_TIMEOUT_S)
        assert run.status == "completed", (run.status, run.error)
        assert str(run.output).startswith("Found:"), run.output
    return [h.run_id for h in handles]


def _worker_env(database_url: str, broker_url: str, provider: ProviderEmulator, **extra: str) -> dict[str, str]:
    return subprocess_env(
        {
            "THREADS_DATABASE_URL": database_url,
            "THREADS_BROKER_URL": broker_url,
            "THREADS_AGENTS": BILLING_AGENTS,
            "OPENAI_BASE_URL": provider.base_url,
            "OPENAI_API_KEY": "test-key",
            **extra,
        }
    )


@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 2), ("threads", 4), ("solo", 1)])
def test_every_pool_makes_the_requests_plain_pydantic_ai_makes_and_counts_them(
    pool: str,
    concurrency: int,
    provider: ProviderEmulator,
    allow_model_requests: None,
    migrated_pg_url: str,
    integration_redis_url: str,
    tmp_path: Path,
) -> None:
    plain = _plain_requests(provider, allow_model_requests)
    assert plain == 2 * RUNS
    env = _worker_env(migrated_pg_url, integration_redis_url, provider)
    worker = WorkerProcess(
        f"bill-{pool}", env=env, log_path=tmp_path / "worker.log", pool=pool, concurrency=concurrency
    )
    with (
        worker.running(),
        registered_client(migrated_pg_url, integration_redis_url, billing.ALL_AGENTS) as threads,
    ):
        run_ids = _run_all(threads)
        used = _usage_of(threads, run_ids)
    assert not provider.errors, provider.errors
    assert len(provider.billed) == plain, f"{pool}: billed {len(provider.billed)}, plain made {plain}"
    assert used == _ledger_totals(provider.billed), f"{pool}: usage {used} against the ledger"
    assert "bound to a different event loop" not in worker.log_text()


def test_embedded_makes_the_requests_plain_pydantic_ai_makes_and_counts_them(
    provider: ProviderEmulator, allow_model_requests: None
) -> None:
    from threads_celery import Threads

    plain = _plain_requests(provider, allow_model_requests)
    with Threads.embedded(concurrency=4) as threads:
        run_ids = _run_all(threads)
        used = _usage_of(threads, run_ids)
    assert not provider.errors, provider.errors
    assert len(provider.billed) == plain == 2 * RUNS
    assert used == _ledger_totals(provider.billed)


def test_a_worker_killed_while_the_provider_answers_leaves_the_voided_request_in_usage(
    migrated_pg_url: str, integration_redis_url: str, tmp_path: Path
) -> None:
    """The first worker is SIGKILLed as its first request reaches the provider, which answers
    (and bills) all the same; Beat's backbone re-dispatches the step once its lease expires, a
    second worker asks again. Usage counts both requests, as the ledger does."""
    killed = threading.Event()
    doomed: list[WorkerProcess] = []

    def kill_on_first_request(body: dict[str, Any]) -> dict[str, Any]:
        process = doomed[0].proc if doomed else None
        if not killed.is_set() and process is not None:
            killed.set()
            os.kill(process.pid, signal.SIGKILL)  # before the answer: it never reads it
        return billing.provider_script(body)

    with ProviderEmulator(kill_on_first_request) as provider:
        leases = {"THREADS_STEP_LEASE_S": "2", "THREADS_RECONCILE_INTERVAL_S": "0.5"}
        env = _worker_env(migrated_pg_url, integration_redis_url, provider, **leases)
        doomed.append(
            WorkerProcess("bill-doomed", env=env, log_path=tmp_path / "doomed.log", pool="solo", concurrency=1)
        )
        rescuer = WorkerProcess("bill-rescuer", env=env, log_path=tmp_path / "rescuer.log", pool="solo", concurrency=1)
        beat = BeatProcess("bill-beat", env=env, log_path=tmp_path / "beat.log", schedule_path=tmp_path / "schedule")
        with registered_client(migrated_pg_url, integration_redis_url, billing.ALL_AGENTS) as threads:
            with doomed[0].running():
                handle = threads.start(billing.durable_agent, _prompt(1))
                eventually(killed.is_set, timeout=60, what="the first request reached the provider")
                eventually(lambda: not doomed[0].alive(), timeout=10, what="the doomed worker died")
            with rescuer.running(), beat:
                beat.start()
                run = threads.wait(handle.run_id, timeout=RUN_TIMEOUT_S)
                used = threads.usage(run_id=handle.run_id)
        billed = list(provider.billed)
    assert run.status == "completed", (run.status, run.error, rescuer.log_tail())
    assert not provider.errors, provider.errors
    assert len(billed) == 3, billed  # the voided request, its retry, the answer after the lookup
    assert used == _ledger_totals(billed)


def test_an_answer_cut_off_mid_stream_is_billed_and_counted(
    monkeypatch: pytest.MonkeyPatch, allow_model_requests: None
) -> None:
    """The provider answers, then the connection drops mid-stream: it bills the answer, the step
    asks again, and usage counts both (the cut one with the tokens of the one that committed)."""
    from threads_celery import Settings, Threads

    cut = threading.Event()

    def cut_the_first_answer(body: dict[str, Any]) -> dict[str, Any]:
        reply = billing.provider_script(body)
        if not cut.is_set():
            cut.set()
            return {**reply, "abort_after": 3}
        return reply

    with ProviderEmulator(cut_the_first_answer) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        settings = Settings.from_env(env={"THREADS_PROVIDER_RETRY_FOR_S": "30"})
        with Threads.embedded(settings=settings) as threads:
            handle = threads.start(billing.durable_agent, _prompt(2))
            run = threads.wait(handle.run_id, timeout=RUN_TIMEOUT_S)
            used = threads.usage(run_id=handle.run_id)
        billed = list(provider.billed)
    assert run.status == "completed", (run.status, run.error)
    assert [b.delivered for b in billed] == [False, True, True]
    assert used.requests == len(billed) == 3
    assert used.input_tokens == sum(b.prompt_tokens for b in billed)
