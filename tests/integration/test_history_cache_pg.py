"""On PostgreSQL: two workers' history caches and a third writer, every step sees the whole thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.history_checks import comparable, drive_with_two_workers
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade


@pytest.fixture
def open_store(pg_url: str) -> Iterator[Callable[[], Store]]:
    opened: list[Store] = []

    def make() -> Store:
        store = Store(create_store_engine(parse_database_url(pg_url)))
        if not opened:
            upgrade(store.engine)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.dispose()


def test_two_workers_and_a_third_writer_give_every_step_the_whole_thread(open_store: Callable[[], Store]) -> None:
    recorder, expected, workers = drive_with_two_workers(open_store, turns=8, inject_every=3)
    assert len(recorder.seen) == len(expected) == 9
    for seen, full in zip(recorder.seen, expected, strict=True):
        assert comparable(seen) == full
    assert all(w.history.hits >= 3 for w in workers)
