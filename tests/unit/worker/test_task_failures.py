"""What a task body's failure becomes in Celery (threads_celery.worker.tasks._run).

A step or tool that fails unforeseen is recorded as a failure (bounded tries, then the run
ends). When the store is away even for that record, the task must be tried again later, like
any task that finds the store away: failing it for good would leave its run to wait for the
lease to lapse, and a tool that already ran to be run again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from threads_celery.decisions.backbone import RECONCILE_TASK
from threads_celery.decisions.retry import STORE_UNAVAILABLE_BACKOFF, RetryDecision
from threads_celery.exceptions import RetryLater, StoreUnavailable
from threads_celery.worker import tasks


class Retried(Exception):
    """What the fake task's retry() raises (Celery raises celery.exceptions.Retry)."""

    def __init__(self, countdown: float, headers: dict[str, Any] | None) -> None:
        super().__init__(countdown)
        self.countdown = countdown
        self.headers = headers


@dataclass
class FakeRequest:
    retries: int = 0
    headers: dict[str, Any] | None = None


@dataclass
class FakeTask:
    name: str = "threads.tool"
    request: FakeRequest = field(default_factory=FakeRequest)

    def retry(self, *, countdown: float, exc: Any, headers: dict[str, Any] | None = None) -> Retried:
        # Celery keeps the request's headers on a retry unless new ones are given.
        return Retried(countdown, self.request.headers if headers is None else headers)


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


@pytest.mark.parametrize("before", [0, 3])
def test_a_failure_the_store_cannot_record_is_tried_again_later(before: int, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[tuple[str, str, int]] = []

    def away(runtime: Any, task: str, key: str, failures: int, exc: BaseException) -> Any:
        recorded.append((task, key, failures))
        return runtime.store.transaction()

    monkeypatch.setattr(tasks, "apply_task_failure", away)
    task = FakeTask(request=FakeRequest(retries=before, headers={tasks.TASK_FAILURES_HEADER: before}))
    with pytest.raises(Retried) as raised:
        tasks._run(task, FakeHolder(), failing, "run_1:0:0")  # type: ignore[arg-type]
    assert recorded == [("threads.tool", "run_1:0:0", before + 1)]
    assert raised.value.countdown == STORE_UNAVAILABLE_BACKOFF.delay_s(before + 1)
    assert raised.value.headers == {tasks.TASK_FAILURES_HEADER: before + 1}  # it failed: counted


def recording(monkeypatch: pytest.MonkeyPatch, countdown: float) -> list[int]:
    """apply_task_failure replaced: it records the failures it is given and says retry."""
    seen: list[int] = []

    def record(runtime: Any, task: str, key: str, failures: int, exc: BaseException) -> RetryDecision:
        seen.append(failures)
        return RetryDecision(countdown)

    monkeypatch.setattr(tasks, "apply_task_failure", record)
    return seen


def test_unforeseen_failures_are_counted_by_failed_tries_not_by_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Five retries that were waits (a held run, a provider's delay) and no failure: this one is
    # the first, so the task is tried again, and the count it carries on is 1.
    seen = recording(monkeypatch, 2.0)
    task = FakeTask(request=FakeRequest(retries=5, headers={"other": "kept"}))
    with pytest.raises(Retried) as raised:
        tasks._run(task, FakeHolder(), failing, "run_1:0:0")  # type: ignore[arg-type]
    assert seen == [1] and raised.value.countdown == 2.0
    assert raised.value.headers == {"other": "kept", tasks.TASK_FAILURES_HEADER: 1}

    task = FakeTask(request=FakeRequest(retries=9, headers=raised.value.headers))
    with pytest.raises(Retried):
        tasks._run(task, FakeHolder(), failing, "run_1:0:0")  # type: ignore[arg-type]
    assert seen == [1, 2]


@pytest.mark.parametrize("headers", [None, {tasks.TASK_FAILURES_HEADER: "2"}, {tasks.TASK_FAILURES_HEADER: -4}])
def test_a_missing_or_nonsense_count_is_no_failure_yet(headers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = recording(monkeypatch, 1.0)
    with pytest.raises(Retried):
        tasks._run(FakeTask(request=FakeRequest(headers=headers)), FakeHolder(), failing, "k")  # type: ignore[arg-type]
    assert seen == [1]


def test_a_wait_keeps_the_counts_and_a_failed_step_adds_to_its_own() -> None:
    counts = {tasks.TASK_FAILURES_HEADER: 1, tasks.STEP_FAILURES_HEADER: 1}
    task = FakeTask(name="threads.step", request=FakeRequest(retries=4, headers=counts))

    def held() -> str:
        raise RetryLater(3.0, "run is held by another worker")

    with pytest.raises(Retried) as waited:
        tasks._run(task, FakeHolder(), held, "run_1")  # type: ignore[arg-type]
    assert waited.value.countdown == 3.0 and waited.value.headers == counts

    def model_failed() -> str:
        raise RetryLater(0.5, "the model's reply could not be stored", failed=True)

    with pytest.raises(Retried) as failed:
        tasks._run(task, FakeHolder(), model_failed, "run_1")  # type: ignore[arg-type]
    assert failed.value.headers == {tasks.TASK_FAILURES_HEADER: 1, tasks.STEP_FAILURES_HEADER: 2}
    assert task.request.headers == counts  # the request's own headers are left as they were


def test_a_failure_without_a_poison_key_propagates() -> None:
    with pytest.raises(ValueError, match="refused"):
        tasks._run(FakeTask(), FakeHolder(), failing)  # type: ignore[arg-type]


class UnavailableTicks:
    """A holder whose runtime's tick finds the store away."""

    settings = SimpleNamespace(control_task_events=False)
    last_tick_started_at: float | None = None
    schedules: Any = None

    def get(self) -> Any:
        def tick() -> Any:
            raise StoreUnavailable("cannot reach the database at postgresql://db/ledger: connection refused")

        return SimpleNamespace(reconcile_tick=tick)


def test_a_tick_that_finds_the_store_away_is_not_retried() -> None:
    # Beat's next tick sweeps all this one would; retrying it would only pile ticks up behind the
    # outage (and Celery fails a task past its third retry).
    app = Celery("ticks", broker="memory://", set_as_current=False)
    tasks.install_tasks(app, UnavailableTicks())  # type: ignore[arg-type]
    result = app.tasks[RECONCILE_TASK].apply(args=(None,))
    assert (result.state, result.result) == ("SUCCESS", "store unavailable")
