"""Bad input to ``Threads``: a clear exception, and nothing written to the ledger.

The ledger here is a SQLite file; the broker is the in-memory transport unless a test points it
at an address where nothing listens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from threads_celery import Agent, Settings, Threads
from threads_celery.exceptions import (
    BrokerUnavailable,
    ConfigError,
    PayloadTooLarge,
    StoreUnavailable,
    UnknownAgent,
)
from threads_celery.store import schema
from threads_celery.testing import ScriptedModel, say

LEDGER_TABLES = (schema.threads, schema.runs, schema.messages, schema.outbox, schema.tool_calls)
SECRET = "hunter2-not-a-real-password"


def known_agent() -> Agent:
    return Agent(name="known", instructions="Help.", model=ScriptedModel([say("ok")]))


def open_ledger(path: Path, broker_url: str = "memory://", **settings: Any) -> Threads:
    threads = Threads(
        database_url=f"sqlite:///{path}",
        broker_url=broker_url,
        settings=Settings.from_env(env={}, **settings),
    )
    threads.register(known_agent())
    return threads


@pytest.fixture
def threads(tmp_path: Path) -> Iterator[Threads]:
    with open_ledger(tmp_path / "ledger.db") as runtime:
        yield runtime


def row_counts(threads: Threads) -> dict[str, int]:
    with threads.store.read() as tx:
        return {t.name: tx.conn.execute(select(func.count()).select_from(t)).scalar_one() for t in LEDGER_TABLES}


NOTHING = {t.name: 0 for t in LEDGER_TABLES}


def test_starting_a_run_writes_rows(threads: Threads) -> None:
    # The "nothing written" checks below are only worth something if the count sees writes.
    threads.start("known", "hi")
    counts = row_counts(threads)
    assert (counts["threads"], counts["runs"], counts["messages"], counts["outbox"]) == (1, 1, 1, 1)


# -- unknown agents --------------------------------------------------------------------------


def test_an_unregistered_agent_name_is_unknown_agent_and_writes_nothing(threads: Threads) -> None:
    with pytest.raises(UnknownAgent) as info:
        threads.start("ghost_agent", "hello")
    message = str(info.value)
    assert "'ghost_agent'" in message
    assert "register" in message
    assert row_counts(threads) == NOTHING


def test_an_unknown_agent_is_a_lookup_error(threads: Threads) -> None:
    with pytest.raises(LookupError):
        threads.start("ghost_agent", "hello")


# -- payloads --------------------------------------------------------------------------------


@pytest.fixture
def small_limit(tmp_path: Path) -> Iterator[Threads]:
    with open_ledger(tmp_path / "ledger.db", max_message_bytes=16) as runtime:
        yield runtime


def test_a_message_over_the_limit_is_payload_too_large_and_writes_nothing(small_limit: Threads) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        small_limit.start("known", "x" * 17)
    assert (info.value.size, info.value.limit) == (17, 16)
    assert str(info.value) == "message is 17 bytes, over the limit of 16 bytes"
    assert row_counts(small_limit) == NOTHING


def test_the_limit_counts_bytes_not_characters(small_limit: Threads) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        small_limit.start("known", "é" * 9)  # 9 characters, 18 bytes in UTF-8
    assert info.value.size == 18
    assert row_counts(small_limit) == NOTHING


def test_a_message_at_the_limit_is_accepted(small_limit: Threads) -> None:
    handle = small_limit.start("known", "x" * 16)
    assert small_limit.get_run(handle.run_id).input == "x" * 16


def test_the_message_limit_comes_from_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env(env={"THREADS_MAX_MESSAGE_BYTES": "4"})
    with Threads(database_url=f"sqlite:///{tmp_path / 'l.db'}", broker_url="memory://", settings=settings) as t:
        t.register(known_agent())
        with pytest.raises(PayloadTooLarge):
            t.start("known", "hello")


@pytest.mark.parametrize("message", [42, b"bytes are not text", None, ["hi"]])
def test_a_message_that_is_not_a_str_is_a_type_error(threads: Threads, message: Any) -> None:
    with pytest.raises(TypeError, match=f"message must be a str, not {type(message).__name__}"):
        threads.start("known", message)
    assert row_counts(threads) == NOTHING


# -- the database URL ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "mysql://x/y",
        "postgresql://",
        "postgresql+asyncpg://postgres@127.0.0.1/db",
        "mongodb://127.0.0.1/db",
    ],
)
def test_a_malformed_database_url_is_a_config_error_naming_the_variable(url: str) -> None:
    with pytest.raises(ConfigError, match="THREADS_DATABASE_URL"):
        Threads(database_url=url, broker_url="memory://")


@pytest.mark.parametrize("scheme", ["postgres", "postgres+psycopg", "postgresql", "postgresql+psycopg2"])
def test_postgres_urls_as_hosting_providers_write_them_mean_postgresql(scheme: str) -> None:
    from threads_celery.store import parse_database_url

    url = parse_database_url(f"{scheme}://ann:pw@db.example:5432/ledger")
    assert url.drivername == "postgresql+psycopg" and url.database == "ledger" and url.password == "pw"


def test_a_database_url_of_another_kind_says_what_to_write_instead() -> None:
    from threads_celery.store import parse_database_url

    with pytest.raises(ConfigError, match=r"uses 'mysql'.*write postgresql://user@host:5432/dbname or sqlite:///"):
        parse_database_url("mysql://x/y")


def test_a_malformed_database_url_from_the_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_DATABASE_URL", "not a url")
    monkeypatch.setenv("THREADS_BROKER_URL", "memory://")
    with pytest.raises(ConfigError, match="THREADS_DATABASE_URL is not a valid database URL"):
        Threads()


def test_a_broker_without_a_database_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="set THREADS_DATABASE_URL"):
        Threads(broker_url="memory://", settings=Settings())


def test_a_database_without_a_broker_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set THREADS_BROKER_URL"):
        Threads(database_url=f"sqlite:///{tmp_path / 'l.db'}", settings=Settings())


# -- unreachable services --------------------------------------------------------------------


def test_an_unreachable_database_is_store_unavailable_with_the_password_masked() -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:1/threads"
    with Threads(database_url=url, broker_url="memory://") as threads:
        for attempt in (lambda: threads.start("known", "hello"), lambda: threads.register(known_agent())):
            with pytest.raises(StoreUnavailable) as info:
                attempt()
            message = str(info.value)
            assert "cannot reach the database at" in message
            assert "127.0.0.1:1/threads" in message
            assert SECRET not in message
            assert SECRET not in repr(info.value)
            assert "***" in message


def test_an_unreachable_database_is_reported_when_reading_too() -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:1/threads"
    with Threads(database_url=url, broker_url="memory://") as threads, pytest.raises(StoreUnavailable) as info:
        threads.get_run("run_x")
    assert SECRET not in str(info.value)


def test_an_unreachable_broker_is_broker_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    broker = f"redis://:{SECRET}@127.0.0.1:1/0"
    with open_ledger(tmp_path / "ledger.db", broker_url=broker) as threads:
        with pytest.raises(BrokerUnavailable) as info:
            threads.start("known", "hello")
        message = str(info.value)
        assert "cannot reach the broker at redis://" in message
        assert "127.0.0.1:1" in message
        assert SECRET not in message
        assert row_counts(threads) == NOTHING
