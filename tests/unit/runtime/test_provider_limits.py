"""Provider rate limits: 429 and 5xx waited out after the advised delay for a bounded time, and the
shared one-minute windows that keep the fleet under a request and token budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.fake_openai import FakeOpenAI
from threads_celery import Agent, ConfigError, Threads
from threads_celery.decisions.provider_limits import (
    ProviderFailure,
    RateLimit,
    classify_provider_failure,
    parse_retry_after,
    provider_of,
    rate_limits_from_json,
    retry_for_from_env,
    window_is_full,
    window_of,
)
from threads_celery.decisions.retry import GiveUp, RetryDecision, decide_provider_retry
from threads_celery.runtime.rate_limiter import LocalWindows, RedisWindows, rate_limiter_for
from threads_celery.settings import Settings

NOW = datetime(2026, 12, 1, 0, 0, 30, tzinfo=UTC)
RUN_TIMEOUT_S = 60.0


# -- decisions ---------------------------------------------------------------------------------


def test_retry_after_is_seconds_or_an_http_date() -> None:
    assert parse_retry_after("7", NOW) == 7.0
    assert parse_retry_after("Tue, 01 Dec 2026 00:00:40 GMT", NOW) == 10.0
    assert parse_retry_after("Tue, 01 Dec 2026 00:00:00 GMT", NOW) == 0.0  # in the past: at once
    assert parse_retry_after("soon", NOW) is None
    assert parse_retry_after(None, NOW) is None


class HttpError(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"status {status}")
        self.status_code = status
        self.headers = headers


def test_429_and_5xx_are_transient_with_their_retry_after_and_4xx_are_not() -> None:
    assert classify_provider_failure(HttpError(429, {"Retry-After": "3"}), NOW) == ProviderFailure(True, 429, 3.0)
    assert classify_provider_failure(HttpError(503), NOW) == ProviderFailure(True, 503, None)
    assert classify_provider_failure(HttpError(401), NOW).transient is False
    assert classify_provider_failure(ConnectionError("reset"), NOW).transient is False  # attempts apply


def test_a_retry_honours_retry_after_and_never_goes_past_the_bound() -> None:
    started = NOW - timedelta(seconds=50)
    retry = decide_provider_retry(
        ProviderFailure(True, 429, 4.0),
        failures_so_far=3,
        first_failed_at=started,
        now=NOW,
        retry_for_s=60,
        reason="429",
    )
    assert retry == RetryDecision(4.0)
    capped = decide_provider_retry(
        ProviderFailure(True, 429, 30.0),
        failures_so_far=3,
        first_failed_at=started,
        now=NOW,
        retry_for_s=60,
        reason="429",
    )
    assert capped == RetryDecision(10.0)
    backoff = decide_provider_retry(
        ProviderFailure(True, 500),
        failures_so_far=3,
        first_failed_at=NOW,
        now=NOW,
        retry_for_s=60,
        reason="500",
    )
    assert backoff == RetryDecision(4.0)
    over = decide_provider_retry(
        ProviderFailure(True, 429, 1.0), failures_so_far=9, first_failed_at=NOW - timedelta(seconds=61), now=NOW,
        retry_for_s=60, reason="status 429",
    )  # fmt: skip
    assert isinstance(over, GiveUp) and "kept failing for 61s" in over.reason and "status 429" in over.reason


def test_a_window_is_full_past_its_requests_or_once_its_tokens_are_spent() -> None:
    limit = RateLimit(requests_per_minute=2, tokens_per_minute=100)
    assert not window_is_full(limit, requests=2, tokens=99)
    assert window_is_full(limit, requests=3, tokens=0)
    assert window_is_full(limit, requests=1, tokens=100)
    window, wait = window_of(NOW)
    assert wait == 30.0 and window == int(NOW.timestamp() // 60)


def test_providers_are_named_by_the_model_strings_prefix() -> None:
    assert provider_of("openai:gpt-4o-mini") == provider_of("openai-chat:gpt-4o") == "openai"
    assert provider_of("anthropic:claude-3-5-haiku") == "anthropic"


@pytest.mark.parametrize(
    "raw",
    [
        "nope",
        "[]",
        '{"openai": 5}',
        '{"openai": {}}',
        '{"openai": {"requests_per_minute": 0}}',
        '{"openai": {"requests_per_minute": 1.5}}',
        '{"openai": {"tokens_per_minute": -3}}',
        '{"openai": {"rpm": 3}}',
    ],
)
def test_nonsense_rate_limits_are_config_errors(raw: str) -> None:
    with pytest.raises(ConfigError, match="THREADS_RATE_LIMITS"):
        Settings.from_env(env={"THREADS_RATE_LIMITS": raw})


@pytest.mark.parametrize("raw", ["0", "-5", "forever", "inf", "nan"])
def test_a_nonsense_retry_bound_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="THREADS_PROVIDER_RETRY_FOR_S"):
        retry_for_from_env(raw)


def test_rate_limits_parse() -> None:
    limits = rate_limits_from_json('{"openai": {"requests_per_minute": 500, "tokens_per_minute": 200000}}')
    assert limits == {"openai": RateLimit(500, 200000)}


# -- the shared windows ------------------------------------------------------------------------


def _exercise(make: Any) -> None:
    limit = {"fakeai": RateLimit(requests_per_minute=2, tokens_per_minute=1000)}
    first, second = make(limit), make(limit)  # two workers of one fleet
    assert first.acquire("fakeai", NOW) is None
    assert second.acquire("fakeai", NOW) is None
    assert first.acquire("fakeai", NOW) == 30.0  # the third request this minute waits for the next
    assert first.acquire("other", NOW) is None  # no limit configured for it
    later = NOW + timedelta(seconds=31)
    assert second.acquire("fakeai", later) is None
    first.spend_tokens("fakeai", 1000, later)
    assert second.acquire("fakeai", later) is not None  # the window's tokens are spent


def test_redis_windows_are_shared_by_every_worker(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter("threads:rate:fakeai:*"):
            client.delete(key)
        _exercise(lambda limits: RedisWindows(redis_url, limits))
    finally:
        for key in client.scan_iter("threads:rate:fakeai:*"):
            client.delete(key)
        client.close()


def test_local_windows_count_the_same_way_within_one_process() -> None:
    shared = LocalWindows({"fakeai": RateLimit(requests_per_minute=2, tokens_per_minute=1000)})
    _exercise(lambda limits: shared)


def test_the_limiter_is_redis_with_a_redis_broker_and_local_otherwise() -> None:
    limits = {"openai": RateLimit(requests_per_minute=1)}
    assert isinstance(rate_limiter_for(limits, "redis://127.0.0.1:6379/6"), RedisWindows)
    assert isinstance(rate_limiter_for(limits, "memory://"), LocalWindows)


# -- against the fake OpenAI-compatible server -------------------------------------------------


def _fake_model(fake: FakeOpenAI) -> Any:
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    # max_retries=0: the SDK would otherwise wait out a 429 itself, inside the worker slot.
    client = AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
    return OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))


@pytest.mark.usefixtures("allow_model_requests")
def test_a_429_with_retry_after_is_retried_after_the_advised_delay() -> None:
    script = [
        {"error": "slow down", "status": 429, "retry_after": "1"},
        {"error": "overloaded", "status": 503},
        {"text": "finally"},
    ]
    with FakeOpenAI(script) as fake, Threads.embedded() as threads:
        agent = Agent(name="patient", instructions="Answer.", model=_fake_model(fake))
        run = threads.wait(threads.start(agent, "hi").run_id, timeout=RUN_TIMEOUT_S)
        assert (run.status, run.output) == ("completed", "finally"), run
        assert len(fake.requests) == 3
        retries = [e.payload for e in threads.events(run.thread_id) if e.type == "model_retry"]
    assert [(r["status"], r["failures"]) for r in retries] == [(429, 1), (503, 2)]
    assert retries[0]["retry_in_s"] == 1.0  # Retry-After, not the backoff


@pytest.mark.usefixtures("allow_model_requests")
def test_a_step_retried_more_often_than_celerys_default_bound_goes_on_in_place() -> None:
    # Celery gives a task 3 retries unless told otherwise; a step's retries are bounded by the
    # provider's time budget instead. No reconcile ticker here: a step task that Celery failed
    # would leave its run running.
    script = [{"error": "slow down", "status": 429, "retry_after": "0"} for _ in range(5)] + [{"text": "at last"}]
    with FakeOpenAI(script) as fake, Threads.embedded(reconcile_interval=None) as threads:
        agent = Agent(name="persistent", instructions="Answer.", model=_fake_model(fake))
        run = threads.wait(threads.start(agent, "hi").run_id, timeout=RUN_TIMEOUT_S)
        assert (run.status, run.output) == ("completed", "at last"), run
        assert len(fake.requests) == 6
        retries = [e.payload["failures"] for e in threads.events(run.thread_id) if e.type == "model_retry"]
    assert retries == [1, 2, 3, 4, 5]


@pytest.mark.usefixtures("allow_model_requests")
def test_a_provider_that_answers_429_forever_ends_the_run_error_after_the_bound() -> None:
    settings = Settings.from_env(env={"THREADS_PROVIDER_RETRY_FOR_S": "3"})
    with (
        FakeOpenAI(lambda body: {"error": "rate limited", "status": 429, "retry_after": "1"}) as fake,
        Threads.embedded(settings=settings) as threads,
    ):
        agent = Agent(name="throttled", instructions="Answer.", model=_fake_model(fake))
        run = threads.wait(threads.start(agent, "hi").run_id, timeout=RUN_TIMEOUT_S)
    assert run.status == "error", run
    assert run.error is not None and "kept failing" in run.error and "429" in run.error, run.error
    assert "THREADS_PROVIDER_RETRY_FOR_S" in run.error
    assert 2 <= len(fake.requests) <= 6  # about one a second for three seconds, not a tight loop


def test_model_strings_leave_the_waiting_to_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from threads_celery.definitions import model_strings as models

    models.forget_models()
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    model = models.resolve_model("openai-chat:gpt-4o-mini")
    assert model.client.max_retries == 0  # the SDK would otherwise retry a 429 inside the slot
    models.forget_models()


@pytest.mark.usefixtures("allow_model_requests")
def test_a_model_string_gets_429_then_the_answer_without_the_sdk_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    from threads_celery.definitions import model_strings as models

    models.forget_models()
    script = [{"error": "slow down", "status": 429, "retry_after": "1"}, {"text": "answered"}]
    with FakeOpenAI(script) as fake, Threads.embedded() as threads:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        agent = Agent(name="stringly", instructions="Answer.", model="openai-chat:gpt-4o-mini")
        run = threads.wait(threads.start(agent, "hi").run_id, timeout=RUN_TIMEOUT_S)
        assert (run.status, run.output) == ("completed", "answered"), run
        assert len(fake.requests) == 2
        [retry] = [e.payload for e in threads.events(run.thread_id) if e.type == "model_retry"]
        assert retry["status"] == 429 and retry["retry_in_s"] == 1.0
    models.forget_models()
