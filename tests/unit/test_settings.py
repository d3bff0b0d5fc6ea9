"""Settings from ``THREADS_*`` environment variables, and the ConfigErrors they can raise."""

from __future__ import annotations

import pytest

from threads_celery import Settings
from threads_celery.exceptions import ConfigError


def test_an_empty_environment_gives_the_defaults() -> None:
    settings = Settings.from_env(env={})
    assert settings.database_url is None
    assert settings.broker_url is None
    assert settings.agents == ()
    assert settings.visibility_timeout_s == 3600
    # The hard limit sits well inside the broker's visibility timeout, the soft one before it.
    assert settings.task_time_limit_s == 1800
    assert settings.task_soft_time_limit_s == 1740
    assert settings.max_message_bytes == 1_000_000
    assert (settings.step_lease_s, settings.tool_lease_s) == (60.0, 300.0)


def test_from_env_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_BROKER_URL", "redis://127.0.0.1:6379/3")
    monkeypatch.setenv("THREADS_MAX_MESSAGE_BYTES", "2048")
    settings = Settings.from_env()
    assert settings.broker_url == "redis://127.0.0.1:6379/3"
    assert settings.max_message_bytes == 2048


def test_every_variable_is_parsed() -> None:
    settings = Settings.from_env(
        env={
            "THREADS_DATABASE_URL": "postgresql://postgres@127.0.0.1/threads",
            "THREADS_BROKER_URL": "redis://127.0.0.1:6379/0",
            "THREADS_AGENTS": "app.agents, billing.agents:refunds ,,",
            "THREADS_STEP_LEASE_S": "12.5",
            "THREADS_TOOL_LEASE_S": "90",
            "THREADS_MAX_MESSAGE_BYTES": "4096",
            "THREADS_VISIBILITY_TIMEOUT_S": "7200",
            "THREADS_TASK_TIME_LIMIT_S": "3000",
            "THREADS_TASK_SOFT_TIME_LIMIT_S": "2900",
            "THREADS_OUTBOX_STALE_AFTER_S": "2.5",
            "THREADS_RECONCILE_INTERVAL_S": "1",
        }
    )
    assert settings.database_url == "postgresql://postgres@127.0.0.1/threads"
    assert settings.broker_url == "redis://127.0.0.1:6379/0"
    assert settings.agents == ("app.agents", "billing.agents:refunds")
    assert settings.step_lease_s == 12.5
    assert settings.tool_lease_s == 90.0
    assert settings.max_message_bytes == 4096
    assert settings.visibility_timeout_s == 7200
    assert (settings.task_time_limit_s, settings.task_soft_time_limit_s) == (3000, 2900)
    assert settings.outbox_stale_after_s == 2.5
    assert settings.reconcile_interval_s == 1.0


def test_empty_values_mean_unset() -> None:
    settings = Settings.from_env(
        env={"THREADS_DATABASE_URL": "", "THREADS_MAX_MESSAGE_BYTES": "", "THREADS_AGENTS": ""}
    )
    assert settings.database_url is None
    assert settings.max_message_bytes == 1_000_000
    assert settings.agents == ()


def test_overrides_win_and_none_is_ignored() -> None:
    settings = Settings.from_env(
        env={"THREADS_BROKER_URL": "redis://from-env/0", "THREADS_MAX_MESSAGE_BYTES": "10"},
        broker_url="redis://override/0",
        max_message_bytes=None,
        model_retries=0,
    )
    assert settings.broker_url == "redis://override/0"
    assert settings.max_message_bytes == 10
    assert settings.model_retries == 0


def test_limits_follow_a_shorter_visibility_timeout() -> None:
    settings = Settings.from_env(env={"THREADS_VISIBILITY_TIMEOUT_S": "600"})
    assert settings.task_time_limit_s == 300
    assert settings.task_soft_time_limit_s == 270  # a tenth of the hard limit, under a minute


def test_a_short_visibility_timeout_still_leaves_the_soft_limit_useful() -> None:
    # A 120 s visibility timeout gives a 60 s hard limit; the soft limit warns shortly before
    # it, not after one second.
    settings = Settings.from_env(env={"THREADS_VISIBILITY_TIMEOUT_S": "120"})
    assert settings.task_time_limit_s == 60
    assert 30 <= settings.task_soft_time_limit_s < 60


def test_a_soft_limit_follows_an_explicit_hard_limit() -> None:
    settings = Settings.from_env(env={"THREADS_TASK_TIME_LIMIT_S": "900"})
    assert (settings.task_time_limit_s, settings.task_soft_time_limit_s) == (900, 840)


# -- ConfigErrors ------------------------------------------------------------------------------


def test_a_time_limit_at_the_visibility_timeout_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"task time limit \(3600s\) must be below the broker's visibility timeout \(3600s\)"
    ):
        Settings.from_env(env={"THREADS_TASK_TIME_LIMIT_S": "3600"})


def test_a_time_limit_above_the_visibility_timeout_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="must be below the broker's visibility timeout"):
        Settings.from_env(env={"THREADS_VISIBILITY_TIMEOUT_S": "600", "THREADS_TASK_TIME_LIMIT_S": "900"})


def test_the_same_check_holds_for_settings_built_in_code() -> None:
    with pytest.raises(ConfigError, match="must be below the broker's visibility timeout"):
        Settings(visibility_timeout_s=100, task_time_limit_s=100, task_soft_time_limit_s=50)


def test_a_soft_limit_at_or_above_the_hard_limit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="the soft time limit must be below the hard time limit"):
        Settings.from_env(env={"THREADS_TASK_TIME_LIMIT_S": "900", "THREADS_TASK_SOFT_TIME_LIMIT_S": "900"})
    with pytest.raises(ConfigError, match="soft time limit"):
        Settings(task_soft_time_limit_s=1800)


@pytest.mark.parametrize(
    "name",
    [
        "THREADS_MAX_MESSAGE_BYTES",
        "THREADS_VISIBILITY_TIMEOUT_S",
        "THREADS_TASK_TIME_LIMIT_S",
        "THREADS_TASK_SOFT_TIME_LIMIT_S",
    ],
)
@pytest.mark.parametrize("raw", ["ten", "1.5", "1e3", "12s"])
def test_a_non_integer_value_is_a_config_error_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env={name: raw})
    assert str(info.value) == f"{name} must be an integer, not {raw!r}"


@pytest.mark.parametrize(
    "name",
    ["THREADS_STEP_LEASE_S", "THREADS_TOOL_LEASE_S", "THREADS_OUTBOX_STALE_AFTER_S", "THREADS_RECONCILE_INTERVAL_S"],
)
def test_a_non_numeric_duration_is_a_config_error_naming_the_variable(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env={name: "soon"})
    assert str(info.value) == f"{name} must be a number, not 'soon'"


@pytest.mark.parametrize("name", ["THREADS_MAX_MESSAGE_BYTES", "THREADS_VISIBILITY_TIMEOUT_S", "THREADS_STEP_LEASE_S"])
@pytest.mark.parametrize("raw", ["0", "-5"])
def test_a_value_that_is_not_positive_is_a_config_error(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be positive"):
        Settings.from_env(env={name: raw})


def test_a_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Settings.from_env(env={"THREADS_MAX_MESSAGE_BYTES": "lots"})


def test_with_returns_a_changed_copy() -> None:
    base = Settings()
    changed = base.with_(model_retries=0)
    assert (base.model_retries, changed.model_retries) == (3, 0)
    with pytest.raises(ConfigError):
        base.with_(task_time_limit_s=5000)
