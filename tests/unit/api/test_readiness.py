"""The census of workers behind ``/readyz``: one ping at a time, remembered for a moment."""

from __future__ import annotations

from threads_celery.api.readiness import FRESH_FOR_S, PING_TIMEOUT_S, REQUIRED_PING_TIMEOUT_S, WorkerCensus


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_census_answers_without_a_new_ping() -> None:
    pings: list[tuple[float, int | None]] = []
    clock = Clock()

    def ping(timeout: float, limit: int | None) -> list[str]:
        pings.append((timeout, limit))
        return ["w2@host", "w1@host"]

    census = WorkerCensus(ping, clock=clock)
    assert census.workers() == ["w1@host", "w2@host"]
    assert census.workers() == ["w1@host", "w2@host"]
    assert pings == [(PING_TIMEOUT_S, None)]
    clock.now += FRESH_FOR_S
    census.workers()
    assert len(pings) == 2


def test_asking_for_more_workers_than_were_seen_pings_again_and_waits_for_them() -> None:
    answers = [["w1@host"], ["w1@host", "w2@host"]]
    pings: list[tuple[float, int | None]] = []

    def ping(timeout: float, limit: int | None) -> list[str]:
        pings.append((timeout, limit))
        return answers[len(pings) - 1]

    census = WorkerCensus(ping, clock=Clock())
    assert census.workers() == ["w1@host"]
    assert census.workers(at_least=1) == ["w1@host"]  # fresh, and enough
    assert census.workers(at_least=2) == ["w1@host", "w2@host"]
    assert pings == [(PING_TIMEOUT_S, None), (REQUIRED_PING_TIMEOUT_S, 2)]


def test_a_failing_ping_reports_no_worker() -> None:
    def ping(timeout: float, limit: int | None) -> list[str]:
        raise ConnectionError("broker gone")

    assert WorkerCensus(ping, clock=Clock()).workers() == []
