"""``/healthz`` and ``/readyz``: is the API up, and can a run it starts make progress.

``/readyz`` checks that the database answers a query and the broker accepts a connection, and it
lists the workers that answer a ping on the broker (Celery's remote control). With
``?worker=N`` it is ready only once at least ``N`` workers answer: a deployment script, or a
quick-start, waits on it before it starts a run, so the run is taken as soon as it is queued.

Pings are serialized and remembered for a moment (:class:`WorkerCensus`): Celery's remote control
shares one reply queue per process, so two pings at once could take each other's answers, and a
burst of probes costs one ping. The embedded store's worker runs inside this process and starts
with the first run, so it is always counted.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse

from threads_celery.api.bodies import ErrorOut, Health

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

log = logging.getLogger(__name__)

#: How long one ping waits for answers when no number of workers is asked for.
PING_TIMEOUT_S = 0.5
#: How long a ping waits for the number of workers asked for (it ends when that many answered).
REQUIRED_PING_TIMEOUT_S = 1.5
#: A census younger than this answers the next probe without a new ping.
FRESH_FOR_S = 1.0
#: The name the embedded, in-process worker is reported under.
IN_PROCESS_WORKER = "in-process"


class WorkerCensus:
    """The workers that answer a ping, asked at most once per :data:`FRESH_FOR_S` at a time.

    ``ping(timeout, limit)`` answers the names of the workers that replied (Celery's
    ``app.control.ping``); it is called with the census's lock held.
    """

    def __init__(self, ping: Callable[[float, int | None], list[str]], *, clock: Callable[[], float] = time.monotonic):
        self._ping = ping
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: list[str] = []
        self._at: float | None = None

    def workers(self, *, at_least: int = 0) -> list[str]:
        """The workers seen just now: a fresh census, or one made now (waiting for ``at_least``)."""
        with self._lock:
            now = self._clock()
            fresh = self._at is not None and now - self._at < FRESH_FOR_S
            if fresh and len(self._seen) >= at_least:
                return list(self._seen)
            timeout = REQUIRED_PING_TIMEOUT_S if at_least else PING_TIMEOUT_S
            try:
                self._seen = sorted(self._ping(timeout, at_least or None))
            except Exception as exc:  # noqa: BLE001 - a probe answers whatever went wrong
                log.warning("readyz: no answer to the workers' ping: %s: %s", type(exc).__name__, exc)
                self._seen = []
            self._at = self._clock()
            return list(self._seen)


def census_of(threads: Threads) -> WorkerCensus:
    """The census of the workers consuming ``threads``' broker (its own, in embedded mode)."""
    if threads.is_embedded:
        return WorkerCensus(lambda _timeout, _limit: [IN_PROCESS_WORKER])

    def ping(timeout: float, limit: int | None) -> list[str]:
        answers = threads.app.control.ping(timeout=timeout, limit=limit) or []
        return [name for answer in answers for name in answer]

    return WorkerCensus(ping)


def install_health(app: FastAPI, threads: Threads) -> None:
    """Add ``/healthz`` and ``/readyz`` to ``app``; both are open (no token)."""
    census = functools.cache(lambda: census_of(threads))  # on the first probe: building routes reads nothing

    @app.get("/healthz", response_model=Health, response_model_exclude_none=True, tags=["health"])
    def healthz() -> Health:
        """The process is up (it does not look at the database or the broker)."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["health"], responses={503: {"model": ErrorOut}})
    def readyz(
        worker: Annotated[
            int, Query(ge=0, le=10_000, description="Ready only once at least this many workers answer a ping.")
        ] = 0,
    ) -> Any:
        """Ready to serve: the database answers a query, the broker accepts a connection, and
        (with ``?worker=N``) at least ``N`` workers answer a ping. ``workers`` lists those that did."""
        checks: dict[str, Any] = {}
        for name, check in (("database", threads.store.ping), ("broker", lambda: threads.publisher.check(timeout=2.0))):
            try:
                check()
                checks[name] = "ok"
            except Exception as exc:  # noqa: BLE001 - a readiness probe answers whatever went wrong
                log.warning("readyz: the %s is unavailable: %s", name, exc)
                checks[name] = "unavailable"
        workers = census().workers(at_least=worker) if checks["broker"] == "ok" else []
        down = [name for name, state in checks.items() if state != "ok"]
        problems = [f"the {' and the '.join(down)} {'is' if len(down) == 1 else 'are'} unavailable"] if down else []
        if worker:
            checks["workers"] = "ok" if len(workers) >= worker else "unavailable"
            if len(workers) < worker:
                problems.append(f"{len(workers)} of the {worker} workers asked for answered a ping")
        if not problems:
            return Health(status="ok", checks=checks, workers=workers)
        message = f"not ready: {'; '.join(problems)}"
        return JSONResponse(
            {
                "error": {"type": "not_ready", "message": message},
                "status": "unavailable",
                "checks": checks,
                "workers": workers,
            },
            status_code=503,
        )


__all__ = ["IN_PROCESS_WORKER", "WorkerCensus", "census_of", "install_health"]
