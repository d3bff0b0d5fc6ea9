"""A versioned worker records its version and that it is alive, so the backbone knows which
versions have live workers (``deploy_workers``, see :mod:`threads_celery.decisions.deploys`).

At start the worker's main process registers its version with its agents' config hashes (the
first version a ledger sees becomes current), then marks itself seen every
``THREADS_DEPLOY_HEARTBEAT_S`` from a thread of its own, on a store of its own (the pool's
processes fork from this one and must not share its connections). A worker that stops removes
its row, so its version loses it at once; one that dies is no longer counted once
``THREADS_DEPLOY_LIVENESS_S`` passed without a mark.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from celery.signals import worker_shutdown

from threads_celery.transitions.publishing import open_store
from threads_celery.transitions.runs import utcnow

if TYPE_CHECKING:
    from threads_celery.runtime.machine import Runtime
    from threads_celery.store import Store

log = logging.getLogger("threads_celery.worker.deploy_heartbeat")


class Heartbeat:
    """Marks one worker of one version alive until stopped."""

    def __init__(self, store: Store, worker: str, version: str, interval_s: float) -> None:
        self.store = store
        self.worker = worker
        self.version = version
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._beat, name="threads-deploy-heartbeat", daemon=True)

    def register(self, agents: dict[str, str]) -> None:
        with self.store.transaction() as tx:
            tx.register_version(self.version, agents, utcnow())
            tx.worker_seen(self.worker, self.version, utcnow())

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                with self.store.transaction() as tx:
                    tx.worker_seen(self.worker, self.version, utcnow())
            except Exception as exc:  # noqa: BLE001 - the next beat tries again; liveness tolerates gaps
                log.warning("deploy heartbeat of %s failed: %s: %s", self.worker, type(exc).__name__, exc)

    def stop(self) -> None:
        """Stop beating and remove this worker's row; never raises. Only in the process that
        started it: a pool process forked from it inherits its exit handler, not its row."""
        if self._stopped.is_set() or os.getpid() != self._pid:
            return
        self._stopped.set()
        try:
            with self.store.transaction() as tx:
                tx.forget_worker(self.worker)
        except Exception as exc:  # noqa: BLE001 - it will age out of the liveness window instead
            log.warning("could not remove worker %s from its version: %s", self.worker, exc)


def start(runtime: Runtime, version: str, interval_s: float) -> Heartbeat:
    """Register ``version`` and keep this worker marked alive in it until the worker shuts down."""
    settings = runtime.settings
    store = open_store(settings.database_url, settings) if settings.database_url else runtime.store
    beat = Heartbeat(store, runtime.worker_id, version, interval_s)
    beat.register({agent.name: agent.config_hash() for agent in runtime.registry})
    beat.start()

    @worker_shutdown.connect(weak=False)
    def _forget(**_: Any) -> None:
        beat.stop()

    atexit.register(beat.stop)
    log.info("worker %s: deploy version %s", runtime.worker_id, version)
    return beat
