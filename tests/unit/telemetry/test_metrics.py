"""Prometheus metrics: ledger gauges (runs by status, parked and awaiting, outbox depth, reconcile
lag) read at each scrape, and step, tool and tick latencies observed where the work runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

from threads_celery import Agent, Threads, tool
from threads_celery.records import OutboxEntry
from threads_celery.testing import ScriptedModel, call, say

pytest.importorskip("prometheus_client", reason="prometheus-client is in the test extra")
from prometheus_client.parser import text_string_to_metric_families

RUN_TIMEOUT_S = 30.0


class NoteIn(BaseModel):
    text: str


note = tool(
    name="note",
    description="Note.",
    input=NoteIn,
    effect="read_only",
    execute=lambda inp, ctx: "ok",
)
send = tool(
    name="send",
    description="Send.",
    input=NoteIn,
    effect="unguarded",
    execute=lambda inp, ctx: "sent",
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_the_ledger_gauges_and_the_latencies_are_exported() -> None:
    from threads_celery.telemetry.metrics import render

    noting = Agent(
        name="metered",
        instructions="Note.",
        model=ScriptedModel([call("note", text="a"), say("done")]),
        tools=[note],
    )
    asking = Agent(
        name="metered-asker",
        instructions="Send.",
        model=ScriptedModel([call("send", text="b"), say("sent")]),
        tools=[send],
    )
    with Threads.embedded() as threads:
        threads.register(noting)
        threads.register(asking)
        done = threads.wait(threads.start("metered", "go").run_id, timeout=RUN_TIMEOUT_S)
        waiting = threads.wait(threads.start("metered-asker", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert (done.status, waiting.status) == ("completed", "awaiting_approval")
        # An outbox row overdue by a minute: what the reconcile backbone should have republished.
        now = datetime.now(UTC)
        with threads.store.transaction() as tx:
            tx.insert_outbox(
                OutboxEntry(key="metrics:probe", task="threads.noop", args=()),
                now - timedelta(minutes=2),
            )
        text = render(threads.store)[0].decode()
        with threads.store.transaction() as tx:
            tx.delete_outbox("metrics:probe")
    found = samples(text)
    assert found[("threads_runs", (("status", "completed"),))] >= 1
    assert found[("threads_awaiting_runs", (("status", "awaiting_approval"),))] == 1
    assert found[("threads_parked_calls", ())] == 0
    assert found[("threads_outbox_depth", ())] >= 1
    assert found[("threads_reconcile_lag_seconds", ())] > 30
    assert found[("threads_step_duration_seconds_count", (("agent", "metered"),))] >= 2
    assert found[("threads_tool_duration_seconds_count", (("tool", "note"),))] >= 1
    assert found[("threads_runs_finished_total", (("status", "completed"),))] >= 1


def test_the_api_serves_metrics_behind_its_token() -> None:
    from fastapi.testclient import TestClient

    from threads_celery.api.app import create_api

    with Threads.embedded() as threads:
        api = TestClient(create_api(threads, tokens={"t"}))
        assert api.get("/v1/metrics").status_code == 401
        response = api.get("/v1/metrics", headers={"Authorization": "Bearer t"})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        assert "threads_outbox_depth" in response.text


def test_a_bad_metrics_port_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from threads_celery import ConfigError
    from threads_celery.worker.application import serve_metrics

    monkeypatch.setenv("THREADS_METRICS_PORT", "ninety")
    with pytest.raises(ConfigError, match="THREADS_METRICS_PORT"):
        serve_metrics(None)  # type: ignore[arg-type]  # refused before the store is touched
