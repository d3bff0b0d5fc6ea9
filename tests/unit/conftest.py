"""The embedded runtime the unit test modules share.

``threads`` is one embedded runtime (a fresh SQLite ledger, an in-process Celery worker and a
reconcile ticker) for all the tests of a module: starting a worker per test would cost more than
most tests. It runs with ``model_retries=0``, so that a scripted model failure is the failure the
test sees, and with its own temporary files root, so that no test writes under the working
directory. A module that needs more worker threads (its tests hold some in a gate while others
must go on) says so with a marker::

    pytestmark = pytest.mark.embedded(concurrency=4)

A test that needs a runtime of its own (a ledger no other test touched, reconcile ticks by hand
only) opens one with the ``embedded_threads`` factory, which takes the arguments of
:meth:`Threads.embedded` and closes the runtime after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from threads_celery import Settings, Threads

EMBEDDED_MARKER = "embedded"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{EMBEDDED_MARKER}(concurrency=2): the worker threads of the module's embedded `threads` runtime"
    )


@pytest.fixture(scope="module")
def threads(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    """The module's embedded runtime (see the module docstring for its settings and marker)."""
    marker = request.node.get_closest_marker(EMBEDDED_MARKER)
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    settings = Settings(model_retries=0, files_root=str(tmp_path_factory.mktemp("files")))
    with Threads.embedded(settings=settings, **options) as runtime:
        yield runtime


@pytest.fixture
def embedded_threads() -> Iterator[Callable[..., Threads]]:
    """Opens an embedded runtime with :meth:`Threads.embedded`'s arguments, closed after the test."""
    with ExitStack() as opened:

        def open_embedded(**options: Any) -> Threads:
            return opened.enter_context(Threads.embedded(**options))

        yield open_embedded
