"""Live events on the runtime handle: :meth:`LiveMixin.live_events` (a thread's, for a web app's
own endpoints) and :meth:`LiveMixin.stream` (a run's, sync or async, typed).

Both merge the committed events with the deltas of the model step in progress
(:mod:`threads_celery.live`). The process subscribes to the broker once, whatever the number of
streams (:class:`~threads_celery.live.hub.LiveHub`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TYPE_CHECKING

from threads_celery.live.events import Committed, Heartbeat, LiveEvent
from threads_celery.live.hub import LiveHub, hub_for
from threads_celery.live.step_stream import nudge
from threads_celery.live.subscription import live_events
from threads_celery.live.transports import bus_for
from threads_celery.records import TERMINAL_STATUSES, Run

if TYPE_CHECKING:
    from threads_celery.settings import Settings
    from threads_celery.store import Store


class LiveMixin:
    """Live events of a thread or a run (a mixin of :class:`~threads_celery.client.threads.Threads`)."""

    # Set by Threads.__init__; declared here so the mixin's use of them is checked.
    settings: Settings
    store: Store

    if TYPE_CHECKING:

        def get_run(self, run_id: str) -> Run: ...

    @property
    def live_hub(self) -> LiveHub:
        """This process's one live subscription for this handle's broker."""
        return hub_for(bus_for(self.settings.broker_url, self.settings.database_url))

    def _nudge_live(self, thread_ids: frozenset[str]) -> None:
        """Tell these threads' live subscribers that events were committed (best effort): what
        a person does through this handle (an approval, a cancel, a variable set) shows at once,
        not at the streams' next slow read."""
        bus = bus_for(self.settings.broker_url, self.settings.database_url)
        for thread_id in thread_ids:
            nudge(bus, thread_id)

    def live_events(
        self, thread_id: str, *, after: int = 0, heartbeat_s: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[LiveEvent | Heartbeat]]:
        """A thread's live events after committed seq ``after``: its committed events and the
        deltas of the step in progress, merged (see :mod:`threads_celery.live.subscription`)::

            async with threads.live_events(thread_id, after=cursor) as events:
                async for event in events:
                    ...

        It never ends by itself; leaving the block unsubscribes. ``thread_id`` is the stored id
        (the HTTP API checks the caller's tenant first). With ``heartbeat_s``, a ``Heartbeat``
        comes after that much silence. Raises ThreadNotFound for an unknown thread.
        """
        return live_events(self.store, self.live_hub, thread_id, after=after, heartbeat_s=heartbeat_s)

    def stream(self, run_id: str) -> RunStream:
        """The run's live events, typed: committed events and deltas alike, until the run ends.

        ``for event in threads.stream(run_id)`` or ``async for event in threads.stream(run_id)``.
        Yields :class:`~threads_celery.live.events.TextDelta`, ``ThinkingDelta``,
        ``ToolCallDelta``, ``StepVoid``, ``Resync`` and ``Committed`` (the run's events from its
        start), and ends after the run's terminal ``run`` event. Raises RunNotFound.
        """
        return RunStream(self, run_id)


class RunStream:
    """A run's live events, iterable both ways (see :meth:`LiveMixin.stream`)."""

    def __init__(self, threads: LiveMixin, run_id: str) -> None:
        self.threads = threads
        self.run_id = run_id

    async def __aiter__(self) -> AsyncGenerator[LiveEvent]:
        run = await asyncio.to_thread(self.threads.get_run, self.run_id)
        async with self.threads.live_events(run.thread_id) as events:
            async for event in events:
                if isinstance(event, Heartbeat):
                    continue
                if isinstance(event, Committed):
                    if event.run_id != run.id:
                        continue
                    yield event
                    if event.type == "run" and event.payload.get("status") in TERMINAL_STATUSES:
                        return
                    continue
                if getattr(event, "run_id", run.id) == run.id:
                    yield event

    def __iter__(self) -> Iterator[LiveEvent]:
        """The same, on a private event loop driven from this thread (not from inside a running loop)."""
        loop = asyncio.new_event_loop()
        events = self.__aiter__()
        try:
            while True:
                try:
                    yield loop.run_until_complete(anext(events))
                except StopAsyncIteration:
                    return
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(events.aclose())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()


__all__ = ["LiveMixin", "RunStream"]
