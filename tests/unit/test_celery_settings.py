"""Users' Celery settings: a configuration module or object and THREADS_CELERY_* variables, merged
with ours; every mistake is a ConfigError naming the variable and the setting."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from threads_celery.celery_settings import (
    GUARDED,
    load_config_object,
    merge_celery_settings,
    settings_of_object,
    settings_of_variables,
    user_celery_settings,
)
from threads_celery.exceptions import ConfigError
from threads_celery.settings import Settings
from threads_celery.transitions.publishing import celery_config


@pytest.fixture
def config_module() -> Iterator[str]:
    module = types.ModuleType("user_celery_config_for_tests")
    module.worker_prefetch_multiplier = 4  # type: ignore[attr-defined]
    module.task_routes = {"threads.tool": {"queue": "threads"}}  # type: ignore[attr-defined]
    module.beat_schedule = {"cleanup": {"task": "myapp.cleanup", "schedule": 60.0}}  # type: ignore[attr-defined]
    module.broker_transport_options = {"max_retries": 3}  # type: ignore[attr-defined]
    module.os = sys  # type: ignore[attr-defined]  # an imported module is not a setting

    def helper() -> None: ...

    module.helper = helper  # type: ignore[attr-defined]

    class Production:
        worker_max_tasks_per_child = 100

    module.Production = Production  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield module.__name__
    finally:
        del sys.modules[module.__name__]


def test_a_configuration_module_is_read_as_config_from_object_reads_it(config_module: str) -> None:
    settings = load_config_object(config_module)
    assert settings["worker_prefetch_multiplier"] == 4
    assert set(settings) == {
        "worker_prefetch_multiplier",
        "task_routes",
        "beat_schedule",
        "broker_transport_options",
    }
    assert "os" not in settings and "helper" not in settings and "Production" not in settings


def test_a_class_or_a_mapping_attribute_is_a_configuration_object(config_module: str) -> None:
    assert load_config_object(f"{config_module}:Production") == {"worker_max_tasks_per_child": 100}
    assert load_config_object("threads_celery.celery_settings:GUARDED") == dict(GUARDED)


def test_a_lowercase_name_that_is_not_a_setting_is_refused(config_module: str) -> None:
    sys.modules[config_module].routes = {"threads.tool": "slow"}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="'routes' is not a Celery setting"):
        load_config_object(config_module)


def test_user_settings_win_over_ours_and_mappings_are_merged(config_module: str) -> None:
    settings = Settings.from_env(
        env={
            "THREADS_CELERY_CONFIG": config_module,
            "THREADS_CELERY_WORKER_PREFETCH_MULTIPLIER": "2",
        }
    )
    config = celery_config(settings, "redis://127.0.0.1:6379/0")
    assert config["worker_prefetch_multiplier"] == 2  # the variable wins over the module
    ours, theirs = config["task_routes"]
    assert theirs == {"threads.tool": {"queue": "threads"}}
    assert ours["threads.reconcile"] == {
        "queue": "threads.control",
        "priority": 0,
    }  # the backbone keeps its queue and lane
    # The reconcile backbone stays scheduled next to the user's entries.
    assert set(config["beat_schedule"]) == {"threads-reconcile", "cleanup"}
    assert config["broker_transport_options"]["max_retries"] == 3
    assert config["broker_transport_options"]["visibility_timeout"] == settings.visibility_timeout_s
    assert config["task_acks_late"] is True and config["task_serializer"] == "json"


def test_variables_are_converted_to_the_settings_type() -> None:
    settings = settings_of_variables(
        {
            "THREADS_CELERY_WORKER_CONCURRENCY": "8",
            "THREADS_CELERY_WORKER_SEND_TASK_EVENTS": "false",
            "THREADS_CELERY_TASK_ROUTES": '{"threads.tool": {"queue": "slow"}}',
            "THREADS_CELERY_BROKER_POOL_LIMIT": "20",
            "OTHER": "ignored",
        }
    )
    assert settings == {
        "worker_concurrency": 8,
        "worker_send_task_events": False,
        "task_routes": {"threads.tool": {"queue": "slow"}},
        "broker_pool_limit": 20,
    }


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"THREADS_CELERY_WORKER_PREFETCH_MULTIPLYER": "4"},
            "did you mean 'worker_prefetch_multiplier'",
        ),
        (
            {"THREADS_CELERY_WORKER_PREFETCH_MULTIPLIER": "many"},
            "worker_prefetch_multiplier takes an int value",
        ),
        ({"THREADS_CELERY_WORKER_SEND_TASK_EVENTS": "maybe"}, "expected true or false"),
        ({"THREADS_CELERY_BROKER_TRANSPORT_OPTIONS": "[1]"}, "expected a JSON object"),
        ({"THREADS_CELERY_TASK_SERIALIZER": "pickle"}, "must stay 'json'"),
        ({"THREADS_CELERY_TASK_ACKS_LATE": "false"}, "delivery guarantees"),
        ({"THREADS_CELERY_BROKER_URL": "redis://elsewhere"}, "set THREADS_BROKER_URL instead"),
        # The time limits and the visibility timeout are checked against each other in one place.
        ({"THREADS_CELERY_TASK_TIME_LIMIT": "7200"}, "set THREADS_TASK_TIME_LIMIT_S instead"),
        ({"THREADS_CELERY_TASK_SOFT_TIME_LIMIT": "60"}, "set THREADS_TASK_SOFT_TIME_LIMIT_S instead"),
        (
            {"THREADS_CELERY_BROKER_TRANSPORT_OPTIONS": '{"visibility_timeout": 60}'},
            "set THREADS_VISIBILITY_TIMEOUT_S instead of broker_transport_options['visibility_timeout']",
        ),
        (
            {"THREADS_CELERY_CONFIG": "no_such_celery_config_module"},
            "cannot import 'no_such_celery_config_module'",
        ),
        ({"THREADS_CELERY_CONFIG": "json:NoSuchThing"}, "has no attribute 'NoSuchThing'"),
    ],
)
def test_a_wrong_setting_or_configuration_module_is_a_config_error(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        Settings.from_env(env=env)
    assert fragment in caught.value.message


def test_a_configuration_module_that_raises_on_import_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exploding_celery_config.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="cannot import 'exploding_celery_config': RuntimeError: boom at import"):
        user_celery_settings({"THREADS_CELERY_CONFIG": "exploding_celery_config"})


def test_unknown_names_in_an_object_are_refused_with_the_closest_setting() -> None:
    with pytest.raises(ConfigError, match="did you mean 'task_routes'"):
        settings_of_object({"task_route": {}}, "test")


def test_merging_refuses_a_guarded_setting_passed_in_python() -> None:
    with pytest.raises(ConfigError, match="accept_content"):
        merge_celery_settings({"accept_content": ["json"]}, {"accept_content": ["json", "pickle"]})


def test_a_configuration_object_cannot_shorten_the_visibility_timeout_either() -> None:
    with pytest.raises(ConfigError, match="set THREADS_VISIBILITY_TIMEOUT_S instead"):
        settings_of_object({"broker_transport_options": {"visibility_timeout": 60, "max_retries": 3}}, "test")
    with pytest.raises(ConfigError, match="set THREADS_TASK_TIME_LIMIT_S instead"):
        merge_celery_settings({}, {"task_time_limit": 7200})


def test_task_events_are_opt_in() -> None:
    """Each task event is one more publish per task; Flower turns the workers' events on itself."""
    quiet = celery_config(Settings.from_env(env={}), "redis://127.0.0.1:6379/0")
    assert quiet["worker_send_task_events"] is False and quiet["task_send_sent_event"] is False
    loud = celery_config(Settings.from_env(env={"THREADS_TASK_EVENTS": "true"}), "redis://127.0.0.1:6379/0")
    assert loud["worker_send_task_events"] is True and loud["task_send_sent_event"] is True


# -- RabbitMQ as production runs it ------------------------------------------------------------


@pytest.mark.parametrize("url", ["amqp://guest:guest@rabbit:5672//", "pyamqp://rabbit//", "amqps://rabbit//"])
def test_rabbitmq_gets_quorum_queues_and_publisher_confirms(url: str) -> None:
    config = celery_config(Settings(), url)
    assert config["broker_transport_options"]["confirm_publish"] is True
    for queue in config["task_queues"]:
        assert queue.queue_arguments == {"x-queue-type": "quorum"}
        assert queue.exchange.type == "topic"  # what Celery's native delayed delivery binds
        assert queue.durable
    # The queues agents and tools name, which Celery creates on first use, are quorum queues too.
    assert config["task_create_missing_queue_type"] == "quorum"
    assert config["task_create_missing_queue_exchange_type"] == "topic"
    assert config["worker_prefetch_multiplier"] == 1


def test_classic_rabbitmq_queues_stay_as_they_were_declared() -> None:
    config = celery_config(Settings.from_env({"THREADS_RABBITMQ_QUEUE_TYPE": "classic"}), "amqp://rabbit//")
    assert config["broker_transport_options"]["confirm_publish"] is True
    assert all(not q.queue_arguments and q.exchange.type == "direct" for q in config["task_queues"])
    assert "task_create_missing_queue_type" not in config


def test_redis_keeps_its_queues() -> None:
    config = celery_config(Settings(), "redis://127.0.0.1:6379/0")
    assert "confirm_publish" not in config["broker_transport_options"]
    assert all(not q.queue_arguments for q in config["task_queues"])


def test_an_unknown_rabbitmq_queue_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="THREADS_RABBITMQ_QUEUE_TYPE must be quorum or classic"):
        Settings.from_env({"THREADS_RABBITMQ_QUEUE_TYPE": "stream"})


def test_a_redis_broker_behind_a_broken_link_cannot_hold_a_publish_for_minutes() -> None:
    options = celery_config(Settings(), "redis://10.0.0.3:6379/0")["broker_transport_options"]
    assert options["socket_connect_timeout"] == 5
    assert options["socket_timeout"] == 10
