"""An in-process Celery worker for the embedded default.

This is the real worker machinery (consumer, task pool, acks, retries) on the memory transport
with a thread pool, run on a background thread. It is what ``threads-celery run`` and
``Threads.embedded()`` use; it is not ``task_always_eager``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from celery.apps.worker import Worker  # noqa: F401 - makes sure worker bootsteps are importable
from celery.exceptions import WorkerShutdown
from celery.utils.nodenames import anon_nodename
from celery.worker import WorkController

from threads_celery.definitions.agents import Agent
from threads_celery.definitions.model_strings import check_model_usable
from threads_celery.exceptions import ThreadsError
from threads_celery.worker.application import RuntimeHolder

log = logging.getLogger("threads_celery.worker.embedded")


def check_runnable_here(agent: Agent) -> None:
    """What the in-process worker would meet at the run's first step, found before the run is
    recorded: a model whose provider package is not installed here, naming the extra to install,
    or whose provider cannot be built (no API key) (:class:`~threads_celery.exceptions.ModelUnavailable`)."""
    check_model_usable(agent.model, agent=agent.name)


class _Controller(WorkController):
    """A WorkController that tells us when its consumer is ready."""

    #: Read by the worker's start-up: the process is the user's, its heap is not frozen.
    threads_embedded = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: Any) -> None:
        self.ready.set()

    def leave_from_within(self) -> bool:
        """Ask the worker's own thread to shut down (warm), as Celery's test worker does; False
        when its consumer is not there to ask.

        The shutdown then closes the broker's channels and connection on the thread that reads
        them. Closed from another thread, a py-amqp connection's channels are torn down under
        the reader: each stop took the whole join timeout on RabbitMQ, and one hung for good.
        The request is a callback on the consumer's event loop (Redis and RabbitMQ; its hub wakes
        for it at once) that raises WorkerShutdown there, which the controller answers with its own warm stop. Celery's test
        worker sets the process-wide ``state.should_terminate`` instead; here a stopping worker
        must not stop another one that this process started after it.
        """
        consumer = getattr(self, "consumer", None)
        if consumer is None or getattr(consumer, "connection", None) is None:
            return False
        if getattr(consumer, "hub", None) is None:
            # No event loop (the embedded memory transport polls): its consumer would see the
            # request only after its next two-second poll, and its channels are the transport's
            # own in-process queues, which another thread may close.
            return False

        def leave() -> None:
            raise WorkerShutdown(0)

        consumer.call_soon(leave)
        return True


class EmbeddedWorker:
    """Runs a Celery worker with a thread pool inside this process."""

    def __init__(
        self,
        runtime: RuntimeHolder,
        *,
        concurrency: int = 2,
        ready_timeout: float = 30.0,
        reconcile_interval: float | None = None,
        queues: Sequence[str] | None = None,
    ) -> None:
        # The app the tasks were installed on (threads_celery.worker.application.install_worker).
        self.runtime = runtime
        self.app = runtime.app
        # None: the app's own queues (work and control); else these, as `-Q` gives them.
        self.queues = list(queues) if queues is not None else None
        self.concurrency = concurrency
        self.ready_timeout = ready_timeout
        self.reconcile_interval = reconcile_interval
        self._controller: _Controller | None = None
        self._thread: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        self._stop_ticks = threading.Event()

    def start(self) -> None:
        if self._controller is not None:
            return
        self.app.finalize()
        # The thread pool resolves task names through the default app; make it ours. (One
        # embedded worker per process at a time: a second one takes the default over.)
        self.app.set_current()
        self.app.set_default()
        controller = _Controller(
            app=self.app,
            hostname=anon_nodename(hostname=None, prefix="threads-embedded"),
            pool="threads",
            concurrency=self.concurrency,
            loglevel=logging.WARNING,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            ready_callback=None,
            queues=self.queues,
        )
        thread = threading.Thread(target=controller.start, name="threads-embedded-worker", daemon=True)
        thread.start()
        if not controller.ready.wait(self.ready_timeout):
            controller.stop(in_sighandler=False)
            raise ThreadsError("the embedded worker did not become ready")
        self._controller, self._thread = controller, thread
        if self.reconcile_interval:
            # What Beat does for a deployment: the reconcile backbone, every few seconds.
            self._stop_ticks.clear()
            self._ticker = threading.Thread(target=self._tick, name="threads-embedded-reconcile", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        assert self.reconcile_interval is not None
        while not self._stop_ticks.wait(self.reconcile_interval):
            try:
                self.runtime.get().reconcile_tick()
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                log.warning("embedded reconcile tick failed: %s: %s", type(exc).__name__, exc)

    def stop(self, timeout: float = 10.0, *, wait: bool = False, then: Callable[[], None] | None = None) -> None:
        """Stop consuming. The consumer's poll takes up to two seconds to notice; unless ``wait``,
        that happens in the background (the queue is this worker's own, so nothing is lost).
        ``then`` runs once the worker has stopped (in the background unless ``wait``)."""
        self._stop_ticks.set()
        controller, thread, ticker = self._controller, self._thread, self._ticker
        self._controller = self._thread = self._ticker = None
        if controller is None:
            if then is not None:
                then()
            return

        def stop_then() -> None:
            if not (controller.leave_from_within() and _joined(thread, timeout)):
                # Its consumer is away (reconnecting to the broker) or did not answer: stop it from here.
                controller.stop(in_sighandler=False)
            for running in (thread, ticker):
                if running is not None:
                    running.join(timeout)
            if then is not None:
                then()

        stopper = threading.Thread(target=stop_then, name="threads-embedded-stop", daemon=True)
        stopper.start()
        if wait:
            stopper.join(timeout * 3)


def _joined(thread: threading.Thread | None, timeout: float) -> bool:
    if thread is not None:
        thread.join(timeout)
    return thread is None or not thread.is_alive()
