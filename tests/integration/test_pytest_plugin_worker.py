"""The pytest plugin's threads_worker fixture on PostgreSQL and Redis: a user's tests, written
into a pytester folder from docs/testing.md, run their agent on the database and the Redis
database the environment names, with a worker inside the test process.

The plugin's Redis database is ``THREADS_TEST_PLUGIN_REDIS_DB`` (default 12) on the server
``redis_url`` points at, flushed first: no other suite's worker consumes it.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.support.docs_blocks import file_blocks
from threads_celery import Threads

pytest_plugins = ["pytester"]


@pytest.fixture
def plugin_redis_url(redis_url: str) -> str:
    """A Redis database for the plugin's worker alone, flushed now."""
    import redis

    raw_db = os.environ.get("THREADS_TEST_PLUGIN_REDIS_DB", "12")
    if not raw_db.isdigit() or not 1 <= int(raw_db) <= 15:
        pytest.fail(f"THREADS_TEST_PLUGIN_REDIS_DB must be an integer in 1..15, got {raw_db!r}")
    parts = urlsplit(redis_url)
    url = f"redis://{parts.hostname}:{parts.port}/{raw_db}"
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


def completed_runs(database_url: str, broker_url: str) -> list[tuple[str, str | None]]:
    """(agent, output) of the completed runs in the database, read by a client of its own."""
    with Threads(database_url=database_url, broker_url=broker_url) as client:
        return [(run.agent, run.output) for run in client.runs(status="completed")]


def test_a_users_test_runs_its_agent_on_postgresql_and_redis(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pg_url: str, plugin_redis_url: str
) -> None:
    monkeypatch.setenv("THREADS_TEST_DATABASE_URL", pg_url)
    monkeypatch.setenv("THREADS_TEST_BROKER_URL", plugin_redis_url)
    pytester.makeconftest(file_blocks("conftest.py")[0])
    (test,) = file_blocks("test_weather_services.py")
    pytester.makepyfile(test_weather_services=test)

    result = pytester.runpytest("-p", "no:cacheprovider", "-v")

    result.assert_outcomes(passed=1)
    # The run is in the database the environment named (migrated by the fixture: pg_url is
    # empty), and its tool ran from its own queue (weather-tools), consumed by the worker.
    assert completed_runs(pg_url, plugin_redis_url) == [("weather", "It is 21 degrees in Paris.")]


def test_the_pages_session_broker_fixture_empties_its_redis_database(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pg_url: str, plugin_redis_url: str
) -> None:
    import redis

    monkeypatch.setenv("THREADS_TEST_DATABASE_URL", pg_url)
    monkeypatch.setenv("THREADS_TEST_BROKER_URL", plugin_redis_url)
    agents, session_broker = file_blocks("conftest.py")
    pytester.makeconftest(agents + "\n\n" + session_broker)
    (test,) = file_blocks("test_weather_services.py")
    pytester.makepyfile(test_weather_services=test)
    client = redis.Redis.from_url(plugin_redis_url)
    try:
        client.set("left-by-an-earlier-session", "1")

        result = pytester.runpytest("-p", "no:cacheprovider", "-v")

        result.assert_outcomes(passed=1)
        assert client.get("left-by-an-earlier-session") is None
    finally:
        client.close()
    assert completed_runs(pg_url, plugin_redis_url) == [("weather", "It is 21 degrees in Paris.")]


def test_the_pages_test_without_the_fixtures_runs_on_postgresql_and_redis(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, pg_url: str, plugin_redis_url: str
) -> None:
    # The page's agents module and test, with the two fixtures it says are the user's own; the
    # plugin's service variables unset: the test does not use its fixtures.
    monkeypatch.delenv("THREADS_TEST_DATABASE_URL", raising=False)
    monkeypatch.delenv("THREADS_TEST_BROKER_URL", raising=False)
    pytester.makepyfile(my_agents=file_blocks("conftest.py")[0])
    pytester.makeconftest(
        f"""
        import pytest

        @pytest.fixture
        def my_database_url():
            return {pg_url!r}

        @pytest.fixture
        def my_redis_url():
            return {plugin_redis_url!r}
        """
    )
    (test,) = file_blocks("test_weather_by_hand.py")
    pytester.makepyfile(test_weather_by_hand=test)

    result = pytester.runpytest("-p", "no:cacheprovider", "-v")

    result.assert_outcomes(passed=1)
    assert completed_runs(pg_url, plugin_redis_url) == [("weather", "It is 21 degrees in Paris.")]
