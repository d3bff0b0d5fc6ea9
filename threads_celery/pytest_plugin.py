"""The pytest plugin threads-celery ships: fixtures for testing your own agents.

Installed with the package and loaded by pytest through the ``pytest11`` entry point named
``threads_celery`` (``-p no:threads_celery`` turns it off), in the spirit of Celery's
``celery_app`` and ``celery_worker`` fixtures:

* ``threads_agents`` -> the agents to register; override it in your ``conftest.py`` or test
  module. None by default.
* ``threads_settings`` -> the :class:`~threads_celery.Settings` both runtimes use; the defaults by
  default, whatever ``THREADS_*`` variables the shell has.
* ``threads`` -> an embedded :class:`~threads_celery.Threads`: SQLite in the test's ``tmp_path``
  and an in-process worker, no services, with ``threads_agents`` registered.
* ``threads_database_url`` / ``threads_broker_url`` -> a PostgreSQL database and a broker (a Redis
  database) for ``threads_worker``, from ``THREADS_TEST_DATABASE_URL`` and
  ``THREADS_TEST_BROKER_URL``; a test that needs one that is unset is skipped (failed, when the
  ``threads_require_services`` ini option is true). Override them to hand out your own.
* ``threads_worker`` -> a :class:`~threads_celery.Threads` on that database and broker: migrated,
  ``threads_agents`` registered, and an in-process worker consuming their queues for the test's
  duration (:func:`threads_celery.testing.start_worker`).

Loading the plugin costs nothing: this module imports only pytest, and a fixture imports the
runtime when a test asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.definitions.agents import Agent
    from threads_celery.settings import Settings

#: The environment variables ``threads_database_url`` and ``threads_broker_url`` read.
DATABASE_URL_VAR = "THREADS_TEST_DATABASE_URL"
BROKER_URL_VAR = "THREADS_TEST_BROKER_URL"
#: The ini option that turns a missing service URL from a skip into a failure (for CI).
REQUIRE_SERVICES_INI = "threads_require_services"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the plugin's ini option."""
    parser.addini(
        REQUIRE_SERVICES_INI,
        type="bool",
        default=False,
        help=(
            f"threads-celery: fail, instead of skip, a test that needs {DATABASE_URL_VAR} or "
            f"{BROKER_URL_VAR} when it is unset (for CI)"
        ),
    )


@pytest.fixture
def threads_agents() -> Sequence[Agent]:
    """The agents ``threads`` and ``threads_worker`` register: none; override this fixture."""
    return ()


@pytest.fixture
def threads_settings() -> Settings:
    """The settings of the ``threads`` and ``threads_worker`` runtimes: the defaults, read from
    no environment variable (so the shell's ``THREADS_*`` never change a test); override this
    fixture to tune them, e.g. ``Settings(model_retries=0)``."""
    from threads_celery.settings import Settings

    return Settings.from_env(env={})


@pytest.fixture
def threads(tmp_path: Path, threads_agents: Sequence[Agent], threads_settings: Settings) -> Iterator[Threads]:
    """An embedded runtime for one test: SQLite in ``tmp_path``, an in-process worker, no
    services, with ``threads_agents`` registered; stopped when the test ends."""
    from threads_celery.client.threads import Threads

    with Threads.embedded(tmp_path / "threads.db", settings=threads_settings) as runtime:
        for agent in threads_agents:
            runtime.register(agent)
        yield runtime


def _missing(config: pytest.Config, what: str, variable: str, fixture: str) -> NoReturn:
    """Skip the test (fail it under ``threads_require_services``): ``variable`` is not set."""
    message = (
        f"{variable} is not set: threads_worker needs {what} (set the variable, or override the {fixture} fixture)"
    )
    if config.getini(REQUIRE_SERVICES_INI):
        pytest.fail(f"{message}; {REQUIRE_SERVICES_INI} is true, so this fails instead of skipping", pytrace=False)
    pytest.skip(message)


def _url_from(config: pytest.Config, variable: str, what: str, fixture: str) -> str:
    """The URL in ``variable``, or the test skipped (or failed) saying what is missing."""
    url = os.environ.get(variable, "").strip()
    if not url:
        _missing(config, what, variable, fixture)
    return url


@pytest.fixture
def threads_database_url(pytestconfig: pytest.Config) -> str:
    """The SQLAlchemy URL of the PostgreSQL database ``threads_worker`` uses, from
    ``THREADS_TEST_DATABASE_URL``; the test is skipped when it is unset."""
    return _url_from(pytestconfig, DATABASE_URL_VAR, "a PostgreSQL database", "threads_database_url")


@pytest.fixture
def threads_broker_url(pytestconfig: pytest.Config) -> str:
    """The broker URL ``threads_worker`` uses (a Redis database of this test session's own), from
    ``THREADS_TEST_BROKER_URL``; the test is skipped when it is unset."""
    return _url_from(pytestconfig, BROKER_URL_VAR, "a broker (a Redis database)", "threads_broker_url")


@pytest.fixture
def threads_worker(
    threads_database_url: str,
    threads_broker_url: str,
    threads_agents: Sequence[Agent],
    threads_settings: Settings,
) -> Iterator[Threads]:
    """A runtime on a real PostgreSQL database and broker with a worker in this process: the
    database migrated, ``threads_agents`` registered, then an in-process worker (Celery's worker
    machinery, a thread pool) consuming the work and control queues and every queue those agents
    and their tools name, until the test ends."""
    from threads_celery.client.threads import Threads
    from threads_celery.testing import start_worker

    with Threads(
        database_url=threads_database_url, broker_url=threads_broker_url, settings=threads_settings
    ) as runtime:
        runtime.migrate()
        for agent in threads_agents:
            runtime.register(agent)
        with start_worker(runtime):
            yield runtime
