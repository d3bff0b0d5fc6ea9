"""A starting worker or Beat waits for a database that does not answer, and only for that."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from threads_celery.exceptions import ConfigError, StoreUnavailable
from threads_celery.runtime import preflight
from threads_celery.runtime.preflight import wait_for_database
from threads_celery.settings import Settings
from threads_celery.store.availability import is_refused_for_good, store_unavailable
from threads_celery.transitions.publishing import open_store

REFUSED = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: Connection refused'
NO_DATABASE = (
    'connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  database "x" does not exist'
)
BAD_PASSWORD = 'connection failed: FATAL:  password authentication failed for user "app"'
STARTING = "connection failed: FATAL:  the database system is starting up"
BOUNCER = "connection failed: FATAL:  pgbouncer cannot connect to server"


def unavailable(text: str) -> StoreUnavailable:
    cause = OperationalError("SELECT 1", {}, Exception(text))
    try:
        raise store_unavailable("postgresql://app@10.0.0.5/x", cause) from cause
    except StoreUnavailable as exc:
        return exc


@pytest.mark.parametrize("text", [REFUSED, STARTING, BOUNCER, "failed to resolve host 'db': Name or service not known"])
def test_a_server_that_is_away_is_worth_waiting_for(text: str) -> None:
    assert not is_refused_for_good(unavailable(text))


@pytest.mark.parametrize("text", [NO_DATABASE, BAD_PASSWORD, 'FATAL:  role "nobody" does not exist'])
def test_a_server_that_said_no_is_not(text: str) -> None:
    assert is_refused_for_good(unavailable(text))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def patched_check(monkeypatch: pytest.MonkeyPatch, answers: list[BaseException | str]) -> list[str]:
    calls: list[str] = []

    def check(_store: object) -> str:
        answer = answers.pop(0)
        calls.append(type(answer).__name__)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(preflight, "check_database", check)
    return calls


def test_it_retries_until_the_database_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = patched_check(monkeypatch, [unavailable(REFUSED), unavailable(STARTING), unavailable(REFUSED), "head"])
    clock, said = Clock(), []
    revision = wait_for_database(
        object(),  # type: ignore[arg-type]
        wait_s=30,
        service="worker",
        say=said.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert revision == "head"
    assert len(calls) == 4
    assert clock.sleeps == [0.5, 1.0, 2.0]  # backing off
    assert len(said) == 3 and all(line.startswith("worker: cannot reach the database") for line in said)


def test_it_refuses_once_the_wait_is_over_saying_how_long_it_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    patched_check(monkeypatch, [unavailable(REFUSED)] * 100)
    clock = Clock()
    with pytest.raises(StoreUnavailable, match=r"cannot reach the database .*\(waited 12s\)"):
        wait_for_database(object(), wait_s=12, service="beat", say=lambda _: None, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert sum(clock.sleeps) == pytest.approx(12)
    assert max(clock.sleeps) <= 5.0


@pytest.mark.parametrize(
    "failure",
    [unavailable(NO_DATABASE), unavailable(BAD_PASSWORD), ConfigError("the database is at migration none, not abc")],
)
def test_what_no_wait_fixes_is_refused_at_once(monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    calls = patched_check(monkeypatch, [failure, "head"])
    clock = Clock()
    with pytest.raises(type(failure)) as raised:
        wait_for_database(object(), wait_s=600, service="worker", say=lambda _: None, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert raised.value is failure
    assert len(calls) == 1 and clock.sleeps == []


def test_zero_waits_not_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = patched_check(monkeypatch, [unavailable(REFUSED), "head"])
    clock = Clock()
    with pytest.raises(StoreUnavailable) as raised:
        wait_for_database(object(), wait_s=0, service="worker", say=lambda _: None, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert "waited" not in str(raised.value)
    assert len(calls) == 1


def test_a_real_closed_port_is_waited_for_then_refused(tmp_path: Path) -> None:
    """Against a real driver error: nothing listens on port 1 of loopback."""
    store = open_store("postgresql://app@127.0.0.1:1/ledger")
    clock = Clock()
    try:
        with pytest.raises(StoreUnavailable, match=r"\(waited 2s\)"):
            wait_for_database(store, wait_s=2, service="worker", say=lambda _: None, clock=clock, sleep=clock.sleep)
    finally:
        store.dispose()
    assert clock.sleeps  # it was a wait, not a refusal


@pytest.mark.parametrize(("raw", "expected"), [("", 60.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_setting(raw: str, expected: float) -> None:
    assert Settings.from_env({"THREADS_DATABASE_STARTUP_WAIT_S": raw}).database_startup_wait_s == expected


@pytest.mark.parametrize("raw", ["-1", "soon", "nan"])
def test_a_bad_setting_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="THREADS_DATABASE_STARTUP_WAIT_S"):
        Settings.from_env({"THREADS_DATABASE_STARTUP_WAIT_S": raw})
