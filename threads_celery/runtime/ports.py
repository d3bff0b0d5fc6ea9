"""What the step machine's parts take from the worker process they run in, as narrow protocols.

A part (the step commit, concurrent calls, delivery, recovery, ...) names the least it needs
rather than the whole machine: :class:`Ledger` to write to the store and publish what it recorded,
:class:`Worker` when it also reads the agents loaded here, the settings or this process's id.
:class:`~threads_celery.runtime.machine.Runtime` has all of it, and passes itself; so a part
imports nothing of the machine and can be read, and driven, without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from threads_celery.records import OutboxEntry

if TYPE_CHECKING:
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.settings import Settings
    from threads_celery.store import Store

#: Sends the outbox rows a transaction recorded, right after it committed.
Publish = Callable[[Sequence[OutboxEntry]], None]


class Ledger(Protocol):
    """The store, the clock its rows are stamped with, and where a commit's outbox rows go."""

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Callable[[], datetime]: ...

    @property
    def publish(self) -> Publish: ...


class Worker(Ledger, Protocol):
    """A worker process as its parts see it: the ledger, the agents loaded here, the settings,
    and the id its leases and delivery claims are taken under."""

    @property
    def registry(self) -> AgentRegistry: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def worker_id(self) -> str: ...
