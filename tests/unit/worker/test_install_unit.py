"""threads_celery.install(app) on a Celery app of the project's own: what it adds to the app's
configuration, what it leaves as the app had it, and the settings it refuses."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from celery import Celery

import threads_celery
from threads_celery.exceptions import ConfigError
from threads_celery.settings import Settings


class DjangoSettings:
    """Settings as a Django project keeps them, read with namespace="CELERY"."""

    CELERY_BROKER_URL = "redis://127.0.0.1:6379/9"
    CELERY_TASK_DEFAULT_QUEUE = "proj"
    CELERY_TASK_SERIALIZER = "pickle"
    CELERY_ACCEPT_CONTENT: ClassVar[list[str]] = ["json", "pickle"]
    CELERY_TASK_ROUTES: ClassVar[dict[str, dict[str, str]]] = {"proj.*": {"queue": "proj"}}
    CELERY_BEAT_SCHEDULE: ClassVar[dict[str, dict[str, Any]]] = {
        "nightly": {"task": "proj.nightly", "schedule": 86400.0}
    }
    CELERY_WORKER_PREFETCH_MULTIPLIER = 4


def project_app(**conf: Any) -> Celery:
    app = Celery("proj", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    app.conf.update(conf)

    @app.task(name="proj.add", shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    return app


SETTINGS = Settings(database_url="postgresql://u@127.0.0.1/db")


def test_the_runtimes_tasks_queues_routes_and_beat_entry_are_added_beside_the_apps_own() -> None:
    app = project_app()
    threads_celery.install(app, settings=SETTINGS)

    assert {"proj.add", "threads.step", "threads.tool", "threads.reconcile", "threads.deliver"} <= set(app.tasks)
    assert [q.name for q in app.conf.task_queues] == ["proj", "threads", "threads.control"]
    # The app's own settings are its own.
    assert app.conf.task_default_queue == "proj" and app.conf.task_serializer == "pickle"
    assert app.conf.worker_prefetch_multiplier == 4
    assert set(app.conf.beat_schedule) == {"nightly", "threads-reconcile"}
    # Routes: the runtime's first, as JSON whatever the app's serializer, then the app's.
    router = app.amqp.router
    assert router.route({}, "threads.step", (), {}, None)["queue"].name == "threads"
    assert router.route({}, "threads.reconcile", (), {}, None)["queue"].name == "threads.control"
    assert router.route({}, "threads.tool", (), {}, None)["serializer"] == "json"
    assert router.route({}, "proj.add", (), {}, None)["queue"].name == "proj"
    # Acknowledged late, given back on a lost worker, no results in the app's backend.
    step = app.tasks["threads.step"]
    assert step.acks_late and step.reject_on_worker_lost and step.ignore_result
    assert step.time_limit == SETTINGS.task_time_limit_s
    assert not app.tasks["proj.add"].ignore_result


def test_the_runtimes_publisher_on_the_apps_worker_sends_work_and_control_to_the_runtimes_queues() -> None:
    from threads_celery.transitions.publishing import Publisher

    app = project_app()
    threads_celery.install(app, settings=SETTINGS)
    assert Publisher(app).control_queue == "threads.control"


def test_installing_twice_is_the_same_runtime() -> None:
    app = project_app()
    first = threads_celery.install(app, settings=SETTINGS)
    assert threads_celery.install(app, settings=SETTINGS) is first
    assert [q.name for q in app.conf.task_queues] == ["proj", "threads", "threads.control"]


def test_an_app_that_refuses_json_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"accept_content .*add 'json'"):
        threads_celery.install(project_app(accept_content=["pickle"]), settings=SETTINGS)


def test_a_visibility_timeout_inside_the_tasks_time_limit_is_refused_naming_it() -> None:
    app = project_app(broker_transport_options={"visibility_timeout": 60})
    with pytest.raises(ConfigError, match=r"visibility_timeout'\] \(60s\) must exceed"):
        threads_celery.install(app, settings=SETTINGS)


def test_an_app_without_a_broker_is_refused() -> None:
    app = Celery("bare", set_as_current=False)
    app.conf.broker_url = None
    with pytest.raises(ConfigError, match="no broker_url"):
        threads_celery.install(app, settings=Settings())
