"""A client on a test's ledger and broker with the test's agents registered, closed after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from threads_celery import Agent, Settings, Threads


@contextlib.contextmanager
def registered_client(
    database_url: str, broker_url: str, agents: Iterable[Agent], *, settings: Settings | None = None
) -> Iterator[Threads]:
    """``Threads(database_url, broker_url)`` with every one of ``agents`` registered."""
    from threads_celery import Threads

    client = Threads(database_url=database_url, broker_url=broker_url, settings=settings)
    try:
        for agent in agents:
            client.register(agent)
        yield client
    finally:
        client.close()


__all__ = ["registered_client"]
