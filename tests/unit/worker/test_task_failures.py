"""What a task body's failure becomes in Celery (threads_celery.worker.tasks._run).

A step or tool that fails unforeseen is recorded as a failure (bounded tries, then the run
ends). When the store is away even for that record, the task must be tried again later, like
any task that finds the store away: failing it for good would leave its run to wait for the
lease to lapse, and a tool that already ran to be run again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from threads_celery.decisions.retry import STORE_UNAVAILABLE_BACKOFF
from threads_celery.exceptions import StoreUnavailable
from threads_celery.worker import tasks


class Retried(Exception):
    """What the fake task's retry() raises (Celery raises celery.exceptions.Retry)."""

    def __init__(self, countdown: float) -> None:
        super().__init__(countdown)
        self.countdown = countdown


@dataclass
class FakeRequest:
    retries: int = 0


@dataclass
class FakeTask:
    name: str = "threads.tool"
    request: FakeRequest = field(default_factory=FakeRequest)

    def retry(self, *, countdown: float, max_retries: Any, exc: Any) -> Retried:
        return Retried(countdown)


class AwayStore:
    def transaction(self) -> Any:
        raise StoreUnavailable("cannot reach the database at postgresql://db/ledger: connection refused")


@dataclass
class FakeRuntime:
    store: AwayStore = field(default_factory=AwayStore)


class FakeHolder:
    def get(self) -> Any:
        return FakeRuntime()


def failing() -> str:
    raise ValueError("the database refused a value")


@pytest.mark.parametrize("retries", [0, 3])
def test_a_failure_the_store_cannot_record_is_tried_again_later(retries: int, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[tuple[str, str, int]] = []

    def away(runtime: Any, task: str, key: str, failures: int, exc: BaseException) -> Any:
        recorded.append((task, key, failures))
        return runtime.store.transaction()

    monkeypatch.setattr(tasks, "apply_task_failure", away)
    task = FakeTask(request=FakeRequest(retries=retries))
    with pytest.raises(Retried) as raised:
        tasks._run(task, FakeHolder(), failing, "run_1:0:0")  # type: ignore[arg-type]
    assert recorded == [("threads.tool", "run_1:0:0", retries + 1)]
    assert raised.value.countdown == STORE_UNAVAILABLE_BACKOFF.delay_s(retries + 1)


def test_a_failure_without_a_poison_key_propagates() -> None:
    with pytest.raises(ValueError, match="refused"):
        tasks._run(FakeTask(), FakeHolder(), failing)  # type: ignore[arg-type]
