"""A model named by string is built once per event loop and never shared between loops: its
HTTP client belongs to the loop it first ran on, and a thread with a loop of its own that used it
would have its request answered (and billed) before failing "bound to a different event loop"."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from threads_celery.definitions.model_strings import forget_models, resolve_model

MODEL = "openai-chat:gpt-4o-mini"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    pytest.importorskip("openai")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    forget_models()
    yield
    forget_models()


async def _resolve_twice() -> tuple[Any, Any]:
    return resolve_model(MODEL), resolve_model(MODEL)


def _on_a_loop_of_its_own(found: list[Any]) -> None:
    loop = asyncio.new_event_loop()
    try:
        found.append(loop.run_until_complete(_resolve_twice()))
    finally:
        loop.close()


def test_one_loop_reuses_its_model_and_two_loops_never_share_one() -> None:
    found: list[Any] = []
    threads = [threading.Thread(target=_on_a_loop_of_its_own, args=(found,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a1, a2), (b1, b2) = found
    assert a1 is a2 and b1 is b2  # built once per loop
    assert a1 is not b1  # each loop its own model, so its own HTTP client


def test_outside_a_loop_each_thread_has_its_own() -> None:
    here = resolve_model(MODEL)
    assert resolve_model(MODEL) is here
    other: list[Any] = []
    t = threading.Thread(target=lambda: other.append(resolve_model(MODEL)))
    t.start()
    t.join()
    assert other[0] is not here


def test_a_model_object_is_returned_as_it_is() -> None:
    model = object()
    assert resolve_model(model) is model
