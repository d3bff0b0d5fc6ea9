"""The polling shells around :class:`~threads_celery.cli.live.RunView`: read the store, feed the view.

:func:`follow_run` watches one run (``threads-celery run``, and after an approval);
:func:`follow_thread` replays a thread's event log and can keep tailing it
(``threads-celery events``). Both read only the store, through anything shaped like
:class:`~threads_celery.client.threads.Threads`, so they work the same embedded and against PostgreSQL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Protocol, TypeVar

from rich.console import Console
from rich.live import Live

from threads_celery.cli.live import STOP_STATUSES, RunView
from threads_celery.records import Event, Run

T = TypeVar("T")
log = logging.getLogger("threads_celery.cli.watch")


class EventSource(Protocol):
    """What the followers read: a :class:`~threads_celery.client.threads.Threads` fits."""

    def events(self, thread_id: str, after: int = 0) -> Iterable[Event]: ...


class RunSource(EventSource, Protocol):
    """What :func:`follow_run` reads: the run's snapshots as well as the thread's events."""

    def get_run(self, run_id: str) -> Run: ...


def _in_live_region(console: Console, view: RunView, watch: Callable[[Console], T]) -> T:
    """Run ``watch`` with the view in a Live region on a terminal, or plainly on a file/pipe."""
    if not console.is_terminal or console.is_dumb_terminal:
        # A file or a pipe: no cursor tricks, just the log of settled entries.
        return watch(console)
    with Live(
        view, console=console, refresh_per_second=12, transient=True, redirect_stdout=False, redirect_stderr=False
    ) as live:
        return watch(live.console)


def follow_run(
    source: RunSource,
    run_id: str,
    thread_id: str,
    *,
    console: Console,
    view: RunView | None = None,
    timeout: float | None = None,
    poll_interval: float = 0.05,
    stop_at: Collection[str] = STOP_STATUSES,
    header: bool = True,
    keep_watching: Callable[[Run], bool] | None = None,
    stop_if: Callable[[Run], bool] | None = None,
) -> Run:
    """Show a run until it reaches a status in ``stop_at``, ``stop_if(run)`` says so, or
    ``timeout`` seconds pass.

    ``keep_watching(run)``, when given, is asked each time the run is found stopped: True carries
    on (e.g. while background child runs it started are still going). Settled entries are
    printed as they settle; on a terminal, what is still moving is shown in a Rich ``Live``
    region below them, which is cleared when watching stops. Returns the last run snapshot read
    (the caller tells a timeout by its status). Print ``view.render_live()`` to show where the
    run stopped, or call again with the same ``view`` and ``header=False`` to carry on watching.
    """
    view = view or RunView(run_id=run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    if header:
        console.print(view.render_header())
    stop_deltas = _feed_deltas(source, run_id, view)

    def watch(printer: Console) -> Run:
        while True:
            # Read the run first: events read after it are at least as new, so the last
            # messages of a run that just ended are never missed.
            run = source.get_run(run_id)
            view.add_events(source.events(thread_id, after=view.last_event_seq))
            view.update(run)
            for renderable in view.take_settled():
                printer.print(renderable)
            stopped = run.status in stop_at and (keep_watching is None or not keep_watching(run))
            stopped = stopped or (stop_if is not None and stop_if(run))
            if stopped or (deadline is not None and time.monotonic() >= deadline):
                return run
            time.sleep(poll_interval)

    try:
        return _in_live_region(console, view, watch)
    finally:
        stop_deltas.set()


def _feed_deltas(source: RunSource, run_id: str, view: RunView) -> threading.Event:
    """Feed the run's live deltas to the view on a thread of their own, when ``source`` streams
    (a :class:`~threads_celery.client.threads.Threads` does); set the event returned to stop."""
    stop = threading.Event()
    stream = getattr(source, "stream", None)
    if not callable(stream):
        return stop

    def feed() -> None:
        try:
            for event in stream(run_id):
                if stop.is_set():
                    return
                view.partial.add(event)
        except Exception as exc:  # noqa: BLE001 - the view goes on with the committed events alone
            log.debug("live deltas of %s: %s", run_id, exc)

    threading.Thread(target=feed, name=f"deltas-{run_id}", daemon=True).start()
    return stop


def follow_thread(
    source: EventSource,
    thread_id: str,
    *,
    console: Console,
    view: RunView | None = None,
    follow: bool = False,
    timeout: float | None = None,
    poll_interval: float = 0.1,
) -> RunView:
    """Replay a thread's events into ``view`` and, with ``follow``, keep tailing the log.

    Tailing stops after ``timeout`` seconds (never, when None: the caller handles Ctrl-C).
    """
    view = view or RunView(thread_id=thread_id)
    deadline = None if timeout is None else time.monotonic() + timeout

    def watch(printer: Console) -> RunView:
        while True:
            view.add_events(source.events(thread_id, after=view.last_event_seq))
            for renderable in view.take_settled():
                printer.print(renderable)
            if not follow or (deadline is not None and time.monotonic() >= deadline):
                return view
            time.sleep(poll_interval)

    return _in_live_region(console, view, watch) if follow else watch(console)


__all__ = ["EventSource", "RunSource", "follow_run", "follow_thread"]
