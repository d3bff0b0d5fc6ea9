"""A step or tool whose pool process is lost is counted, so that one that kills every worker it
runs on ends its run instead of running for ever.

A pool process can die under a task without raising anything the task could handle: a tool that
calls ``os._exit`` or crashes the interpreter, the kernel's out-of-memory killer, Celery's hard
time limit. Celery then gives the message back to the broker (``reject_on_worker_lost``) or, past
the hard limit, acknowledges it and the backbone sends the task again after its lease: either
way the same step or call runs again, and a call that kills its worker every time would run for
ever with its run ``running``.

The worker's main process sees each loss (it runs the request's failure handlers), so it counts
it in the ledger: ``tool_calls.lost_times`` for a call, ``runs.lost_step`` and ``runs.lost_times``
for a step (migration 0011). The next delivery reads the count with the row it reads anyway,
and once it reaches ``Settings.max_task_failures`` the run ends ``error`` with the reason
(:mod:`threads_celery.runtime.failures`). Below that, a lost call is recovered by its effect as
before. Counting is best effort: when the ledger cannot be reached the loss is logged and the
task goes back to the broker as Celery would send it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]  # not in its stubs
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from threads_celery.transitions.publishing import open_store
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK

if TYPE_CHECKING:
    from threads_celery.store import Store
    from threads_celery.worker.application import RuntimeHolder

log = logging.getLogger("threads_celery.worker.lost_workers")

#: How long the main process waits for a loss to be counted before it goes on without.
COUNT_WAIT_S = 5.0


class LossCounter:
    """Counts losses in the ledger from the worker's main process, on a store of its own."""

    def __init__(self, holder: RuntimeHolder) -> None:
        self.holder = holder
        self._store: Store | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def count(self, task: str, args: Any, pid: object) -> None:
        """Count the loss of pool process ``pid`` running ``task`` with ``args``, and end the leases
        it held (the runtime's worker id is ``host:pid``); never raises.

        Done before Celery gives the message back, so that its next delivery reads the count; on a
        thread of its own, waited for :data:`COUNT_WAIT_S` at most, so that a ledger that does not
        answer cannot hold up the worker's main loop.
        """
        owner = f"{socket.gethostname()}:{pid}"
        counting = threading.Thread(
            target=self._count, args=(task, args, owner), name="threads-lost-worker", daemon=True
        )
        counting.start()
        counting.join(COUNT_WAIT_S)
        if counting.is_alive():
            log.warning("counting a lost %s took over %gs; going on without waiting", task, COUNT_WAIT_S)

    def _count(self, task: str, args: Any, owner: str) -> None:
        now = datetime.now(UTC)
        try:
            store = self._open()
            with store.transaction() as tx:
                if task == STEP_TASK:
                    run_id, step = args
                    tx.count_lost_step(str(run_id), int(step), owner=owner, now=now)
                elif task == TOOL_TASK:
                    (effect_key,) = args
                    tx.count_lost_call(str(effect_key), owner=owner, now=now)
        except Exception as exc:  # noqa: BLE001 - the task goes back to the broker uncounted
            log.warning("a lost %s could not be counted: %s: %s", task, type(exc).__name__, exc)

    def _open(self) -> Store:
        with self._lock:
            return self._opened()

    def _opened(self) -> Store:
        if self._store is None or self._pid != os.getpid():
            settings = self.holder.settings
            if not settings.database_url:
                raise RuntimeError("THREADS_DATABASE_URL is not set for this worker")
            self._store, self._pid = open_store(settings.database_url, settings), os.getpid()
        return self._store


def counting_request(counter: LossCounter) -> type[Request]:
    """The Request class of the step and tool tasks: Celery's, counting the losses of their pool
    processes before Celery's own handling of them."""

    class CountingRequest(Request):
        def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
            lost = exc_info.exception
            if isinstance(lost, ExceptionWithTraceback):  # as billiard hands it over
                lost = lost.exc
            if isinstance(lost, WorkerLostError):
                counter.count(self.task.name, self.args, self.worker_pid)  # task_name: the shadow
            super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

        def on_timeout(self, soft: bool, timeout: float) -> None:
            if not soft:  # the hard limit: the pool process is killed
                counter.count(self.task.name, self.args, self.worker_pid)
            super().on_timeout(soft, timeout)

    return CountingRequest


__all__ = ["LossCounter", "counting_request"]
