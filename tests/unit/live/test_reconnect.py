"""A live publisher's reconnection: one attempt at a time, on a thread of its own, and after a
loss a pause that doubles up to a bound (a broker that is gone is not hammered)."""

from __future__ import annotations

import threading

import pytest

from threads_celery.live import reconnect
from threads_celery.live.reconnect import FIRST_RETRY_S, MAX_RETRY_S, Reconnects


class Clock:
    now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_one_attempt_at_a_time_then_a_doubling_pause_after_each_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(reconnect.time, "monotonic", clock.monotonic)
    started = threading.Semaphore(0)
    attempts: list[str] = []

    def connect() -> None:
        attempts.append(threading.current_thread().name)
        started.release()

    reconnects = Reconnects(connect, "test-connect")
    reconnects.soon()
    assert started.acquire(timeout=10)
    reconnects.soon()  # one is under way: no second
    assert attempts == ["test-connect"]
    pauses = []
    for _ in range(8):
        reconnects.lost()
        reconnects.soon()  # within the pause: nothing
        assert not reconnects.connecting
        waited = 0.0
        while not reconnects.connecting:
            clock.now += 0.05
            waited += 0.05
            reconnects.soon()
        assert started.acquire(timeout=10)
        pauses.append(round(waited, 2))
    assert pauses[0] == pytest.approx(FIRST_RETRY_S, abs=0.06)
    assert pauses == sorted(pauses) and pauses[-1] == pytest.approx(MAX_RETRY_S, abs=0.06)
    reconnects.made()  # a success: the next loss pauses briefly again
    reconnects.lost()
    clock.now += FIRST_RETRY_S + 0.01
    reconnects.soon()
    assert started.acquire(timeout=10) and len(attempts) == 10
