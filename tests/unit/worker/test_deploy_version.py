"""A worker's deployment version: explicit, or derived from its agents (``auto``); and the queues
an app of that version consumes. Without a version the app is what it was."""

from __future__ import annotations

import pytest

from threads_celery.decisions.deploys import derive_version
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import ConfigError
from threads_celery.settings import Settings
from threads_celery.transitions.publishing import celery_app, deploy_version_of
from threads_celery.worker.application import resolve_deploy_version

AGENTS = ("tests.integration.deploy_agents",)
REDIS = "redis://127.0.0.1:6379/11"  # never connected to: the app is only configured


def test_auto_derives_the_version_from_the_agents_config_hashes() -> None:
    registry = AgentRegistry()
    settings = resolve_deploy_version(Settings(deploy_version="auto", agents=AGENTS), registry)
    assert settings.deploy_version == derive_version({a.name: a.config_hash() for a in registry})
    again = resolve_deploy_version(Settings(deploy_version="auto", agents=AGENTS), AgentRegistry())
    assert again.deploy_version == settings.deploy_version  # the same code, the same version


def test_auto_without_agents_is_refused() -> None:
    with pytest.raises(ConfigError, match="THREADS_AGENTS"):
        resolve_deploy_version(Settings(deploy_version="auto"), AgentRegistry())


def test_an_explicit_version_is_kept_and_a_bad_one_refused() -> None:
    assert resolve_deploy_version(Settings(deploy_version="v7"), AgentRegistry()).deploy_version == "v7"
    with pytest.raises(ConfigError, match="THREADS_DEPLOY_VERSION"):
        Settings.from_env({"THREADS_DEPLOY_VERSION": "v@7"})


def test_a_versioned_app_consumes_its_versions_queue_the_plain_one_and_the_shared_control_queue() -> None:
    app = celery_app(Settings(deploy_version="v7"), broker_url=REDIS)
    assert deploy_version_of(app) == "v7"
    assert app.conf.task_default_queue == "threads@v7"
    assert sorted(q.name for q in app.conf.task_queues) == ["threads", "threads.control", "threads@v7"]
    assert {route["queue"] for route in app.conf.task_routes.values()} == {"threads.control"}


def test_without_a_version_the_app_is_as_before() -> None:
    app = celery_app(Settings(), broker_url=REDIS)
    assert deploy_version_of(app) is None and "threads_deploy_version" not in app.conf
    assert sorted(q.name for q in app.conf.task_queues) == ["threads", "threads.control"]
    embedded = celery_app(Settings(deploy_version="v7"), broker_url="memory://")
    assert deploy_version_of(embedded) is None  # the embedded worker runs no version
