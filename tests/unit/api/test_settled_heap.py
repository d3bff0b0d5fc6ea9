"""The API process leaves what its start-up made out of later garbage collections.

A full collection walks every object the collector tracks while holding the GIL, and a serving
process starts with some 200,000 of them (its imports and the app): no stream is written to
meanwhile. ``app_from_environment`` freezes them once the app is built, so a collection walks
only what was made after start-up.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from threads_celery.api.app import app_from_environment


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    """Put the collector back as it was: nothing frozen."""
    frozen_before = gc.get_freeze_count()
    yield
    if frozen_before == 0:
        gc.unfreeze()


def tracked(thing: object) -> bool:
    """Whether ``thing`` is among what a collection walks (the frozen generation is not)."""
    return any(o is thing for o in gc.get_objects())


def test_the_app_of_the_environment_freezes_what_start_up_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen_after: None
) -> None:
    monkeypatch.chdir(tmp_path)  # the embedded ledger goes under the working directory
    for name in ("THREADS_DATABASE_URL", "THREADS_BROKER_URL", "THREADS_AGENTS", "THREADS_API_AUTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("THREADS_API_TOKENS", "settled-heap-token-0123456789")
    made_at_start_up: list[object] = [object()]
    assert tracked(made_at_start_up)

    app = app_from_environment(embedded=True)
    try:
        assert gc.get_freeze_count() > 0
        assert not tracked(made_at_start_up)
        assert not tracked(app.state.threads)
        made_while_serving: list[object] = [object()]
        assert tracked(made_while_serving)  # what requests make is still collected
    finally:
        app.state.threads.close()
