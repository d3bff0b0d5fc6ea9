"""Model usage: recorded per committed step, summed per run, thread and agent-day, priced from the
price table; durable limits checked before each model call; nonsense limits are ConfigErrors."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from threads_celery import Agent, ConfigError, Threads, tool
from threads_celery.decisions.usage import Limits, Prices, UsageLimits, day_bounds, limit_reached
from threads_celery.records import UsageTotals
from threads_celery.settings import Settings
from threads_celery.testing import ScriptedModel, call, say

RUN_TIMEOUT_S = 30.0


class EchoIn(BaseModel):
    text: str


echo = tool(
    name="echo",
    description="Echo.",
    input=EchoIn,
    effect="read_only",
    execute=lambda inp, ctx: inp.text,
)


def three_step_agent(name: str, **kwargs: Any) -> Agent:
    script = ScriptedModel(
        [call("echo", text="one"), call("echo", text="two"), say("done")],
        model_name="scripted-model",
    )
    return Agent(name=name, instructions="Echo twice.", model=script, tools=[echo], **kwargs)


# -- the decision ------------------------------------------------------------------------------


def test_a_limit_is_reached_when_the_total_meets_it() -> None:
    limits = UsageLimits(per_run=Limits(requests=2), per_agent_per_day=Limits(cost=1.0))
    assert limit_reached({"run": UsageTotals(requests=1)}, limits) is None
    reached = limit_reached({"run": UsageTotals(requests=2)}, limits)
    assert reached is not None and (reached.scope, reached.measure) == ("run", "requests")
    assert reached.message.startswith("usage-limit: this run used 2 requests")
    day = limit_reached({"run": UsageTotals(requests=1), "agent-day": UsageTotals(cost=1.5)}, limits)
    assert day is not None and day.scope == "agent-day" and day.measure == "cost"


def test_total_tokens_sum_input_and_output() -> None:
    limits = UsageLimits(per_thread=Limits(total_tokens=100))
    assert limit_reached({"thread": UsageTotals(input_tokens=60, output_tokens=39)}, limits) is None
    assert limit_reached({"thread": UsageTotals(input_tokens=60, output_tokens=40)}, limits) is not None


@pytest.mark.parametrize(
    "make",
    [
        lambda: Limits(requests=0),
        lambda: Limits(requests=-1),
        lambda: Limits(requests=1.5),  # type: ignore[arg-type]
        lambda: Limits(requests=True),  # type: ignore[arg-type]
        lambda: Limits(input_tokens="many"),  # type: ignore[arg-type]
        lambda: Limits(cost=float("nan")),
        lambda: Limits(cost=float("inf")),
        lambda: Limits(),
        lambda: UsageLimits(),
        lambda: UsageLimits(per_run={"requests": 3}),  # type: ignore[arg-type]
        lambda: UsageLimits(per_run=Limits(requests=3), on_limit="shrug"),  # type: ignore[arg-type]
        lambda: Agent(
            name="a",
            instructions="x",
            model=ScriptedModel([say("x")]),
            usage_limits={"requests": 1},
        ),  # type: ignore[arg-type]
    ],
)
def test_nonsense_limits_are_config_errors(make: Any) -> None:
    with pytest.raises(ConfigError):
        make()


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1]",
        '{"m": 1}',
        '{"m": {"input": 1}}',
        '{"m": {"input": -1, "output": 1}}',
        '{"m": {"input": "x", "output": 1}}',
    ],
)
def test_a_nonsense_price_table_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="THREADS_MODEL_PRICES"):
        Settings.from_env(env={"THREADS_MODEL_PRICES": raw})


def test_prices_are_per_million_tokens_by_the_first_name_priced() -> None:
    prices = Prices.from_json('{"scripted-model": {"input": 2.0, "output": 10.0}}')
    assert prices.cost(("openai:x", "scripted-model"), 500_000, 100_000) == pytest.approx(2.0)
    assert prices.cost(("unpriced",), 10, 10) is None


def test_a_day_is_the_utc_day() -> None:
    start, end = day_bounds(datetime(2026, 12, 1, 23, 59, tzinfo=UTC))
    assert (start, end) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC))


# -- on the runtime ----------------------------------------------------------------------------


def test_each_step_records_its_usage_and_cost_summed_per_run_thread_and_agent() -> None:
    settings = Settings.from_env(env={"THREADS_MODEL_PRICES": '{"scripted-model": {"input": 1.0, "output": 4.0}}'})
    with Threads.embedded(settings=settings) as threads:
        threads.register(three_step_agent("usage-recorder"))
        run = threads.wait(threads.start("usage-recorder", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert run.status == "completed", run
        per_run = threads.usage(run_id=run.id)
        assert per_run.requests == 3
        assert per_run.input_tokens > 0 and per_run.output_tokens > 0
        assert per_run.cost == pytest.approx((per_run.input_tokens * 1.0 + per_run.output_tokens * 4.0) / 1e6)
        assert threads.usage(thread_id=run.thread_id) == per_run
        assert threads.usage(agent="usage-recorder", day=datetime.now(UTC).date()) == per_run
        assert threads.usage(agent="usage-recorder", day=date(2000, 1, 1)) == UsageTotals(0, 0, 0, None)


def test_a_run_that_reaches_its_limit_ends_interrupted_before_the_next_model_call() -> None:
    agent = three_step_agent("usage-capped", usage_limits=UsageLimits(per_run=Limits(requests=2)))
    with Threads.embedded() as threads:
        threads.register(agent)
        run = threads.wait(threads.start("usage-capped", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert run.status == "interrupted", run
        assert run.error is not None and run.error.startswith("usage-limit:"), run.error
        assert threads.usage(run_id=run.id).requests == 2  # the third call was never made


def test_the_per_thread_limit_holds_across_runs_of_the_thread() -> None:
    agent = three_step_agent("thread-capped", usage_limits=UsageLimits(per_thread=Limits(requests=4)))
    with Threads.embedded() as threads:
        threads.register(agent)
        first = threads.wait(threads.start("thread-capped", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert first.status == "completed", first
        second = threads.wait(
            threads.start("thread-capped", "again", thread_id=first.thread_id).run_id,
            timeout=RUN_TIMEOUT_S,
        )
        assert second.status == "interrupted" and "this thread used 4 requests" in (second.error or ""), second


# -- shown in the API and the CLI -------------------------------------------------------------


def test_the_api_and_the_cli_show_usage(tmp_path: Any) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from threads_celery.api.app import create_api
    from threads_celery.cli.app import app as cli_app

    db = tmp_path / "usage.db"
    with Threads.embedded(db) as threads:
        threads.register(three_step_agent("usage-shown"))
        run = threads.wait(threads.start("usage-shown", "go").run_id, timeout=RUN_TIMEOUT_S)
        expected = threads.usage(run_id=run.id).to_json()
        api = TestClient(create_api(threads, tokens={"t"}))
        auth = {"Authorization": "Bearer t"}
        assert api.get(f"/v1/runs/{run.id}/usage", headers=auth).json() == expected
        assert api.get(f"/v1/threads/{run.thread_id}/usage", headers=auth).json() == expected
        today = datetime.now(UTC).date().isoformat()
        assert api.get(f"/v1/usage?agent=usage-shown&day={today}", headers=auth).json() == expected
        assert api.get("/v1/runs/run_nosuchrun/usage", headers=auth).status_code == 404
        assert api.get("/v1/threads/thr_nosuchthread/usage", headers=auth).status_code == 404
        assert api.get("/v1/usage?agent=usage-shown&day=today", headers=auth).json() == expected  # as the CLI
        assert api.get("/v1/usage?day=yesterday", headers=auth).status_code == 422
        impossible = api.get("/v1/usage?day=2026-13-45", headers=auth)
        assert impossible.status_code == 422 and impossible.json()["error"]["type"] == "validation_error"
    runner = CliRunner()
    shown = runner.invoke(
        cli_app,
        ["usage", "--run", run.id, "--db", str(db), "--json"],
        env={"THREADS_DATABASE_URL": "", "THREADS_BROKER_URL": ""},
    )
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == expected
    bad_day = runner.invoke(
        cli_app,
        ["usage", "--day", "someday", "--db", str(db)],
        env={"THREADS_DATABASE_URL": "", "THREADS_BROKER_URL": ""},
    )
    assert bad_day.exit_code == 2
    show = runner.invoke(
        cli_app,
        ["runs", "show", run.id, "--db", str(db), "--json"],
        env={"THREADS_DATABASE_URL": "", "THREADS_BROKER_URL": ""},
    )
    assert json.loads(show.stdout)["usage"] == expected


def test_the_web_page_shows_the_runs_usage() -> None:
    from fastapi.testclient import TestClient

    from examples.webapp.app import create_app

    with Threads.embedded() as threads:
        threads.register(three_step_agent("usage-on-the-page"))
        run = threads.wait(threads.start("usage-on-the-page", "go").run_id, timeout=RUN_TIMEOUT_S)
        web = TestClient(create_app(threads))
        page = web.get(f"/runs/{run.id}")
        assert page.status_code == 200
        assert 'id="run-usage">3 model calls' in page.text
        usage = web.get(f"/runs/{run.id}/usage").json()
        assert usage["requests"] == 3 and usage["text"].startswith("3 model calls")
        assert web.get("/runs/run_nosuch/usage").status_code == 404


# -- on_limit="ask": a person lets the run go on -----------------------------------------------


def test_a_run_asked_to_wait_at_its_limit_parks_and_goes_on_when_a_person_allows_it() -> None:
    from fastapi.testclient import TestClient

    from threads_celery.api.app import create_api
    from threads_celery.api.tenancy import parse_token_entry
    from threads_celery.exceptions import ConfigError as NotParked

    limits = UsageLimits(per_run=Limits(requests=2), on_limit="ask")
    with Threads.embedded() as threads:
        threads.register(three_step_agent("usage-asks", usage_limits=limits))
        run_id = threads.start("usage-asks", "go").run_id
        parked = threads.wait(run_id, timeout=RUN_TIMEOUT_S)
        assert parked.status == "parked", parked
        assert (parked.error or "").startswith("usage-limit: this run used 2 requests"), parked.error
        assert threads.usage(run_id=run_id).requests == 2
        api = TestClient(create_api(threads, tokens={"t"}))
        auth = {"Authorization": "Bearer t"}
        assert api.post(f"/v1/runs/{run_id}/allow-usage", json={"principal": ""}, headers=auth).status_code == 422
        allowed = api.post(f"/v1/runs/{run_id}/allow-usage", json={"principal": "alice"}, headers=auth)
        assert allowed.status_code == 200 and allowed.json()["status"] == "running", allowed.text
        done = threads.wait(run_id, timeout=RUN_TIMEOUT_S)
        assert (done.status, done.output) == ("completed", "done"), done
        assert threads.usage(run_id=run_id).requests == 3
        allowances = [e.payload for e in threads.events(done.thread_id) if e.type == "usage.allowed"]
        # Recorded under the token's principal, not the name in the body.
        assert [a["principal"] for a in allowances] == [parse_token_entry("t")[1].principal]
        with pytest.raises(NotParked, match="not parked at a usage limit"):
            threads.allow_usage(run_id, principal="alice")
        assert api.post(f"/v1/runs/{run_id}/allow-usage", json={"principal": "bob"}, headers=auth).status_code == 409
        assert api.post("/v1/runs/run_nosuch/allow-usage", json={"principal": "bob"}, headers=auth).status_code == 404


def test_the_cli_lets_a_parked_run_go_on(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from threads_celery.cli.app import app as cli_app

    db = tmp_path / "ask.db"
    env = {"THREADS_DATABASE_URL": "", "THREADS_BROKER_URL": ""}
    limits = UsageLimits(per_run=Limits(requests=2), on_limit="ask")
    # A short reconcile interval: the CLI's own process publishes to no worker, the backbone of
    # the runtime below republishes the step it left in the outbox.
    settings = Settings.from_env(env={"THREADS_OUTBOX_STALE_AFTER_S": "0.5", "THREADS_RECONCILE_INTERVAL_S": "0.2"})
    with Threads.embedded(db, settings=settings) as threads:
        threads.register(three_step_agent("usage-asks-cli", usage_limits=limits))
        run_id = threads.start("usage-asks-cli", "go").run_id
        assert threads.wait(run_id, timeout=RUN_TIMEOUT_S).status == "parked"
        refused = CliRunner().invoke(cli_app, ["runs", "allow-usage", run_id, "--db", str(db)], env=env)
        assert refused.exit_code == 2  # --principal is required
        allowed = CliRunner().invoke(
            cli_app, ["runs", "allow-usage", run_id, "--principal", "alice", "--db", str(db)], env=env
        )
        assert allowed.exit_code == 0, allowed.output
        assert threads.wait(run_id, timeout=RUN_TIMEOUT_S).status == "completed"
