"""Running tasks in this process: the in-process worker part of
:class:`~threads_celery.client.threads.Threads` (a mixin).

A client publishes; it runs tasks only when asked: :meth:`~InProcessWorkerMixin.start_worker`
(the embedded default does on demand, and your own integration tests may) and
:meth:`~InProcessWorkerMixin.reconcile` (one backbone tick, what Beat schedules). Those are the
only places the client loads worker code, and they import it inside the function: a web app's
process must not load the Celery tasks, the runtime that runs them, or the model layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import EllipsisType
from typing import TYPE_CHECKING

from celery import Celery

from threads_celery.decisions.backbone import control_queue_for

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent, AgentRegistry
    from threads_celery.settings import Settings
    from threads_celery.store import Store
    from threads_celery.transitions.publishing import Publisher
    from threads_celery.worker.application import RuntimeHolder
    from threads_celery.worker.embedded import EmbeddedWorker


class InProcessWorkerMixin:
    """An in-process Celery worker and reconcile ticks, on request."""

    # Set by Threads.__init__; declared here so the mixin's use of them is checked.
    app: Celery
    settings: Settings
    registry: AgentRegistry
    store: Store
    publisher: Publisher
    is_embedded: bool
    _worker: EmbeddedWorker | None
    _worker_concurrency: int
    _reconcile_interval: float | None

    def start_worker(
        self,
        *,
        queues: Sequence[str] | None = None,
        reconcile_interval: float | EllipsisType | None = ...,
    ) -> None:
        """Start an in-process worker (idempotent): Celery's real worker machinery with a thread
        pool, on a thread of this process.

        Embedded mode starts it on demand. With PostgreSQL and a broker it is for your own
        integration tests (see :func:`threads_celery.testing.start_worker`): it consumes the work
        and control queues, plus the queues that registered agents and their tools name, or
        exactly ``queues`` when given (the control queue is always added). It ticks the reconcile
        backbone every ``reconcile_interval`` seconds (this handle's interval by default; None: never).
        """
        if self._worker is None:
            # Imported here, on request: a web app's process holds this handle only to publish,
            # and must not load the worker code (and with it the runtime and the model layer).
            from threads_celery.worker.embedded import EmbeddedWorker

            self._worker = EmbeddedWorker(
                self._worker_runtime(),
                concurrency=self._worker_concurrency,
                reconcile_interval=self._reconcile_interval if reconcile_interval is ... else reconcile_interval,
                queues=None if self.is_embedded else self._queues_to_consume(queues),
            )
            self._worker.start()

    def _check_runnable_here(self, agent: Agent) -> None:
        """Embedded, this process runs the run's steps: refuse now, with the one line its first step
        would end on, what cannot run here (a model whose provider package is missing). A client
        of a broker checks nothing: the workers have the packages, and its own process need not."""
        if self.is_embedded:
            # Imported here, on request: see start_worker.
            from threads_celery.worker.embedded import check_runnable_here

            check_runnable_here(agent)

    def _worker_runtime(self) -> RuntimeHolder:
        """The worker side of this process: the tasks installed on :attr:`app` and the runtime
        they use (``app.threads_runtime``), on first use."""
        # Imported here, on request: see start_worker.
        from threads_celery.worker.application import install_worker

        return install_worker(self.app, self.settings, self.registry, self.store)

    def _queues_to_consume(self, queues: Sequence[str] | None) -> list[str]:
        work = str(self.app.conf.task_default_queue)
        if queues is None:
            named = {agent.queue for agent in self.registry} | {
                t.queue for agent in self.registry for t in agent.runtime_tools if t.queue
            }
            queues = [work, *sorted(q for q in named if q and q != work)]
        return [*queues, *([] if control_queue_for(work) in queues else [control_queue_for(work)])]

    def stop_worker(self, timeout: float = 10.0) -> None:
        """Stop the in-process worker, if any, and wait until it has stopped."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(timeout, wait=True)

    def close(self, *, then: Callable[[], None] | None = None) -> None:
        """Stop the in-process worker, if any, and release connections.

        ``then`` runs once the in-process worker has stopped (in the background)."""
        store, publisher = self.store, self.publisher

        def after_stop() -> None:
            publisher.close()
            store.dispose()
            if then is not None:
                then()

        if self._worker is not None:
            self._worker.stop(then=after_stop)
            self._worker = None
            store.dispose()  # connections this thread holds go now; the worker's go after it stops
        else:
            after_stop()

    def reconcile(self) -> dict[str, int]:
        """Run one reconcile tick in this process (what Beat schedules)."""
        return self._worker_runtime().get().reconcile_tick()
