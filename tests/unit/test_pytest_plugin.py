"""The pytest plugin the package ships (threads_celery.pytest_plugin): a user's own tests, written
into a pytester folder from docs/testing.md, get an embedded runtime with their agents; the
services fixtures skip (or fail, when asked) without their URLs; loading the plugin imports
nothing heavy.

The worker fixture on PostgreSQL and Redis is tested in
tests/integration/test_pytest_plugin_worker.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from tests.support.docs_blocks import file_blocks

pytest_plugins = ["pytester"]

#: Modules a pytest run that never asks for a fixture of the plugin must not have loaded.
HEAVY = ("threads_celery.client", "threads_celery.testing", "sqlalchemy", "celery", "pydantic_ai", "redis")


@pytest.fixture
def no_service_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THREADS_TEST_DATABASE_URL", raising=False)
    monkeypatch.delenv("THREADS_TEST_BROKER_URL", raising=False)


def test_the_plugin_is_registered_with_pytest() -> None:
    (plugin,) = [e for e in entry_points(group="pytest11") if e.name == "threads_celery"]
    assert plugin.value == "threads_celery.pytest_plugin"


def test_loading_the_plugin_imports_neither_the_runtime_nor_its_libraries() -> None:
    probe = (
        "import sys, threads_celery.pytest_plugin; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_a_users_test_gets_an_embedded_runtime_with_its_agents(pytester: pytest.Pytester) -> None:
    # The page's conftest.py and test_weather.py in a folder of their own; beside it, a test with
    # no threads_agents of its own.
    conftest = file_blocks("conftest.py")[0]
    (test,) = file_blocks("test_weather.py")
    weather = pytester.mkpydir("weather")
    (weather / "conftest.py").write_text(conftest)
    (weather / "test_weather.py").write_text(test)
    (weather / "test_weather_after.py").write_text(
        textwrap.dedent(
            """
            def test_the_runtime_is_embedded_in_the_tests_folder(threads, tmp_path):
                assert threads.is_embedded
                assert (tmp_path / "threads.db").is_file()

            def test_each_test_has_a_runtime_of_its_own(threads):
                assert threads.runs() == []  # test_weather.py's run was in another one
            """
        )
    )
    pytester.makepyfile(
        test_no_agents="""
            import pytest
            from threads_celery import UnknownAgent

            def test_no_agents_are_registered_by_default(threads):
                with pytest.raises(UnknownAgent):
                    threads.start("weather", "hello")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_weather.py::test_the_weather_agent_calls_its_tool PASSED*"])


@pytest.mark.usefixtures("no_service_urls")
def test_the_worker_fixture_skips_naming_the_missing_variable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_services="""
            def test_on_services(threads_worker):
                raise AssertionError("ran without services")
        """,
        test_my_database="""
            import pytest

            @pytest.fixture
            def threads_database_url():
                return "postgresql+psycopg://nobody@127.0.0.1:1/none"

            def test_on_my_database(threads_worker):
                raise AssertionError("ran without a broker")
        """,
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*THREADS_TEST_BROKER_URL is not set: threads_worker needs a broker*",
            "*THREADS_TEST_DATABASE_URL is not set: threads_worker needs a PostgreSQL database*",
        ]
    )


@pytest.mark.usefixtures("no_service_urls")
def test_the_ini_option_turns_the_skip_into_a_failure(pytester: pytest.Pytester) -> None:
    (ini,) = file_blocks("pyproject.toml")
    pytester.makepyprojecttoml(ini)
    pytester.makepyfile("def test_on_services(threads_worker):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*THREADS_TEST_DATABASE_URL is not set*threads_require_services is true*"])


def test_the_plugin_can_be_turned_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_embedded(threads):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:threads_celery")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'threads' not found*"])
