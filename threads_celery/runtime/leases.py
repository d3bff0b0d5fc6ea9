"""Keeping the leases of work in progress alive from a background thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("threads_celery.runtime.leases")


class LeaseKeeper:
    """Renews the leases of work in progress from a background thread.

    A lease says "this process is alive". The keeper dies with its process (SIGKILL, OOM) and
    stops with it (SIGSTOP), which is exactly when the lease should lapse; a hung call is bounded
    by the task time limit, which ends the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[Callable[[], bool], float, float]] = {}
        self._thread: threading.Thread | None = None
        self._next_token = 0

    @contextmanager
    def hold(self, renew: Callable[[], bool], interval: float) -> Iterator[None]:
        """Call ``renew`` every ``interval`` seconds until the block ends or it returns False."""
        interval = max(0.2, interval)
        with self._lock:
            self._next_token += 1
            token = self._next_token
            self._held[token] = (renew, interval, time.monotonic() + interval)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="threads-lease-keeper", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(token, None)

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            with self._lock:
                due = [(token, renew, interval) for token, (renew, interval, at) in self._held.items() if at <= now]
                for token, renew, interval in due:
                    self._held[token] = (renew, interval, now + interval)
                upcoming = [at for (_, _, at) in self._held.values()]
            for token, renew, _ in due:
                try:
                    still_held = renew()
                except Exception as exc:  # noqa: BLE001 - a failed renewal is tried again next time
                    log.warning("lease renewal failed: %s", exc)
                    continue
                if not still_held:
                    with self._lock:
                        self._held.pop(token, None)
            time.sleep(min(1.0, max(0.05, min(upcoming) - time.monotonic())) if upcoming else 0.5)
