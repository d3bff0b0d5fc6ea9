"""A worker's history cache gives every step exactly what a full read of the thread gives."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, update

from tests.support.history_checks import comparable, drive_with_two_workers
from threads_celery.records import Message, ToolCall, ToolResult
from threads_celery.runtime.history import HistoryCache, message_size
from threads_celery.runtime.models import ModelHistory, to_model_messages
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import messages
from threads_celery.transitions import runs as run_ledger


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[object]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    opened: list[Store] = []

    def make() -> Store:
        store = Store(create_store_engine(parse_database_url(url)))
        if not opened:
            upgrade(store.engine)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.dispose()


def _thread(store: Store) -> str:
    with store.transaction() as tx:
        run, _ = run_ledger.submit_run(tx, agent="a", config_hash="h", message="hello", now=run_ledger.utcnow())
    return run.thread_id


def _append(store: Store, thread_id: str, text: str, role: str = "user") -> None:
    with store.transaction() as tx:
        tx.insert_message(thread_id=thread_id, run_id=None, role=role, text=text, now=run_ledger.utcnow())


def _full(store: Store, thread_id: str) -> list[Message]:
    with store.read() as tx:
        return tx.list_messages(thread_id)


def _load(cache: HistoryCache, store: Store, thread_id: str) -> list[Message]:
    with store.transaction() as tx:
        return cache.load(tx, thread_id).messages


def test_a_second_worker_appending_is_seen_by_the_next_load(open_store) -> None:  # type: ignore[no-untyped-def]
    mine, theirs = open_store(), open_store()
    thread_id = _thread(mine)
    cache = HistoryCache()
    assert _load(cache, mine, thread_id) == _full(theirs, thread_id)
    for i in range(3):
        _append(theirs, thread_id, f"from the other worker {i}")
        assert _load(cache, mine, thread_id) == _full(theirs, thread_id)
    assert [m.text for m in _load(cache, mine, thread_id)][-3:] == [f"from the other worker {i}" for i in range(3)]
    assert (cache.misses, cache.hits) == (1, 4)


def test_a_changed_or_removed_end_makes_a_full_read(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    thread_id = _thread(store)
    for i in range(4):
        _append(store, thread_id, f"m{i}")
    cache = HistoryCache()
    _load(cache, store, thread_id)
    with store.transaction() as tx:  # the last message rewritten
        tx.conn.execute(
            update(messages).where(messages.c.thread_id == thread_id, messages.c.seq == 4).values(text="rewritten")
        )
    assert _load(cache, store, thread_id) == _full(store, thread_id)
    assert _load(cache, store, thread_id)[-1].text == "rewritten"
    with store.transaction() as tx:  # the first message rewritten
        tx.conn.execute(
            update(messages).where(messages.c.thread_id == thread_id, messages.c.seq == 0).values(text="redacted")
        )
    assert _load(cache, store, thread_id)[0].text == "redacted"
    with store.transaction() as tx:  # retention drops the oldest messages
        tx.conn.execute(delete(messages).where(messages.c.thread_id == thread_id, messages.c.seq < 2))
    assert _load(cache, store, thread_id) == _full(store, thread_id)
    with store.transaction() as tx:  # the newest goes, and another takes its place
        tx.conn.execute(delete(messages).where(messages.c.thread_id == thread_id, messages.c.seq == 4))
    _append(store, thread_id, "replacement")
    assert [m.text for m in _load(cache, store, thread_id)] == ["m1", "m2", "replacement"]
    assert cache.misses == 5


def test_a_gap_in_the_sequence_makes_a_full_read(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    thread_id = _thread(store)
    cache = HistoryCache()
    _load(cache, store, thread_id)
    with store.transaction() as tx:
        tx.insert_message(thread_id=thread_id, run_id=None, role="user", text="later", now=run_ledger.utcnow(), seq=5)
    assert _load(cache, store, thread_id) == _full(store, thread_id)
    assert cache.misses == 2


def test_the_cache_stays_within_its_bound(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    threads = [_thread(store) for _ in range(6)]
    one = message_size(_full(store, threads[0])[0])
    cache = HistoryCache(max_bytes=3 * one)
    for thread_id in threads:
        _load(cache, store, thread_id)
    assert len(cache) == 3 and cache.size <= 3 * one
    big = _thread(store)
    _append(store, big, "x" * (4 * one))
    assert _load(cache, store, big) == _full(store, big)
    assert len(cache) == 3  # too big to keep: read in full each time, never cached
    by_count = HistoryCache(max_threads=2)
    for thread_id in threads:
        _load(by_count, store, thread_id)
    assert len(by_count) == 2
    _load(by_count, store, threads[-1])
    assert by_count.hits == 1  # the most recent threads stay


def _random_history(rng: random.Random, n: int) -> list[Message]:
    out: list[Message] = []
    for seq in range(n):
        kind = rng.choice(["user", "assistant", "assistant-calls", "tool", "tool-error"])
        if kind == "assistant-calls":
            calls = tuple(
                ToolCall(id=f"c{seq}.{i}", name="t", args='{"a": 1}', effect_key=f"k{seq}.{i}")
                for i in range(rng.randint(1, 3))
            )
            out.append(Message("t", seq, "assistant", rng.choice(["", "thinking"]), tool_calls=calls))
        elif kind.startswith("tool"):
            out.append(
                Message("t", seq, "tool", "r", tool_result=ToolResult(f"c{seq}", "t", "r", kind == "tool-error"))
            )
        else:
            out.append(Message("t", seq, kind, f"text {seq}"))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_incremental_conversion_equals_a_full_one(seed: int) -> None:
    rng = random.Random(seed)
    history = _random_history(rng, 40)
    converted = ModelHistory()
    end = 0
    while end < len(history):
        end = min(len(history), end + rng.randint(0, 5))
        prompt = rng.choice(["", "be brief"])
        assert comparable(converted.messages(prompt, history[:end])) == comparable(
            to_model_messages(prompt, history[:end])
        )
    # A shorter history than the one followed so far is converted afresh, not misread.
    assert comparable(converted.messages("p", history[:3])) == comparable(to_model_messages("p", history[:3]))


def test_two_workers_and_a_third_writer_give_every_step_the_whole_thread(open_store) -> None:  # type: ignore[no-untyped-def]
    recorder, expected, workers = drive_with_two_workers(open_store, turns=6, inject_every=2)
    assert len(recorder.seen) == len(expected) == 7
    for seen, full in zip(recorder.seen, expected, strict=True):
        assert comparable(seen) == full
    # Both workers served later steps from their caches (reading only what was new).
    assert all(w.history.hits >= 2 for w in workers)
