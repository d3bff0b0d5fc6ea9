"""``Store.on_events_committed``: told which threads a transaction appended events to, after it commits.

The client hands it the live bus's nudge, so what a person does through the client or the API (an
approval, a cancel) reaches the threads' live streams at once. A transaction that rolls back
tells nothing; nor does one that appended no event; a listener that fails loses no commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from threads_celery import Threads
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.transitions import runs


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(create_store_engine(parse_database_url(f"sqlite:///{tmp_path / 'l.db'}")))
    upgrade(store.engine)
    return store


def _thread(store: Store, thread_id: str) -> None:
    with store.transaction() as tx:
        tx.insert_thread(thread_id, "a", "h", runs.utcnow())


def test_a_commit_tells_the_threads_its_events_are_in(store: Store) -> None:
    told: list[frozenset[str]] = []
    _thread(store, "t1")
    _thread(store, "t2")
    store.on_events_committed = told.append
    with store.transaction() as tx:
        tx.append_event("t1", None, "note", {}, runs.utcnow())
        tx.append_event("t2", None, "note", {}, runs.utcnow())
        tx.append_event("t1", None, "note", {}, runs.utcnow())
        assert told == []  # not before the commit
    assert told == [frozenset({"t1", "t2"})]
    with store.transaction() as tx:
        tx.insert_thread("t3", "a", "h", runs.utcnow())  # no event
    assert told == [frozenset({"t1", "t2"})]


def test_a_rollback_tells_nothing_and_a_failing_listener_loses_no_commit(store: Store) -> None:
    _thread(store, "t1")
    told: list[frozenset[str]] = []
    store.on_events_committed = told.append
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.append_event("t1", None, "note", {}, runs.utcnow())
        raise RuntimeError("rolled back")
    assert told == []

    def failing(_threads: frozenset[str]) -> None:
        raise ConnectionError("bus down")

    store.on_events_committed = failing
    with store.transaction() as tx:
        seq = tx.append_event("t1", None, "note", {}, runs.utcnow())
    with store.read() as tx:
        assert [e.seq for e in tx.list_events("t1")] == [seq]


def test_the_client_nudges_the_live_bus_for_what_it_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from threads_celery.client import live

    nudged: list[str] = []
    monkeypatch.setattr(live, "nudge", lambda _bus, thread_id: nudged.append(thread_id))
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        _thread(threads.store, "t9")
        assert nudged == []
        with threads.store.transaction() as tx:
            tx.append_event("t9", None, "note", {}, runs.utcnow())
        assert nudged == ["t9"]
