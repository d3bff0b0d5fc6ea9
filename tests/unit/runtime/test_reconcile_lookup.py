"""The reconcile lookup shell: answers, failures and timeouts become values the decision reads."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from threads_celery.decisions.effects import (
    CallRecord,
    Found,
    LookupFailed,
    LookupUnknown,
    NeedsLookup,
    NotFound,
    Park,
    Reconcile,
    RecordFound,
    RunAgain,
    decide_recovery,
)
from threads_celery.runtime.reconcile_lookup import run_lookup

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def call(effect: Any, *, finality: Any = None) -> CallRecord:
    """A reconcilable call that started and whose lease expired."""
    return CallRecord(
        effect_key="call-1",
        effect=effect,
        status="started",
        attempt=1,
        first_started_at=NOW - timedelta(seconds=5),
        lease_expires_at=NOW - timedelta(seconds=1),
        finality=finality,
    )


def test_run_lookup_returns_a_sync_answer_and_passes_the_effect_key() -> None:
    seen: list[str] = []

    def lookup(key: str) -> Found:
        seen.append(key)
        return Found({"id": 7})

    assert run_lookup(Reconcile(finality="final", lookup=lookup), "call-9") == Found({"id": 7})
    assert seen == ["call-9"]


@pytest.mark.parametrize("answer", [NotFound(), LookupUnknown("cannot tell")])
def test_run_lookup_returns_every_kind_of_answer(answer: Any) -> None:
    assert run_lookup(Reconcile(finality="final", lookup=lambda key: answer), "k") == answer


def test_run_lookup_awaits_an_async_lookup() -> None:
    async def lookup(key: str) -> Found:
        await asyncio.sleep(0)
        return Found(key.upper())

    assert run_lookup(Reconcile(finality="final", lookup=lookup), "abc") == Found("ABC")


def test_run_lookup_works_from_inside_a_running_event_loop() -> None:
    async def lookup(key: str) -> NotFound:
        return NotFound()

    async def caller() -> Any:
        return run_lookup(Reconcile(finality="final", lookup=lookup), "k")

    assert asyncio.run(caller()) == NotFound()


def test_run_lookup_turns_an_exception_into_a_failure_without_a_traceback() -> None:
    def lookup(key: str) -> Found:
        raise ConnectionError("provider unreachable")

    answer = run_lookup(Reconcile(finality="final", lookup=lookup), "k")
    assert answer == LookupFailed("lookup raised ConnectionError: provider unreachable")


def test_run_lookup_turns_an_async_exception_into_a_failure() -> None:
    async def lookup(key: str) -> Found:
        raise KeyError("k")

    answer = run_lookup(Reconcile(finality="final", lookup=lookup), "k")
    assert answer == LookupFailed("lookup raised KeyError: 'k'")


def test_run_lookup_names_an_exception_without_a_message() -> None:
    def lookup(key: str) -> Found:
        raise RuntimeError

    answer = run_lookup(Reconcile(finality="final", lookup=lookup), "k")
    assert answer == LookupFailed("lookup raised RuntimeError")


def test_run_lookup_gives_up_on_a_hanging_sync_lookup_at_its_timeout() -> None:
    release = threading.Event()

    def lookup(key: str) -> Found:
        release.wait()  # hangs until the test lets it go
        return Found("late")

    try:
        answer = run_lookup(Reconcile(finality="final", lookup=lookup, timeout_s=0.2), "k")
    finally:
        release.set()
    assert answer == LookupFailed("lookup did not answer within 0.2 s")


def test_run_lookup_gives_up_on_a_hanging_async_lookup_and_cancels_it() -> None:
    cancelled = threading.Event()

    async def lookup(key: str) -> Found:
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Found("never")

    answer = run_lookup(Reconcile(finality="final", lookup=lookup, timeout_s=0.2), "k")
    assert answer == LookupFailed("lookup did not answer within 0.2 s")
    # The coroutine is cancelled rather than left running forever; the wait is a safety bound.
    assert cancelled.wait(timeout=10)


@pytest.mark.parametrize(
    ("returned", "type_name"),
    [
        (None, "NoneType"),
        ({"status": "found", "value": 1}, "dict"),
        ("found", "str"),
        (LookupFailed("x"), "LookupFailed"),
    ],
)
def test_run_lookup_rejects_a_return_value_of_the_wrong_type(returned: Any, type_name: str) -> None:
    answer = run_lookup(Reconcile(finality="final", lookup=lambda key: returned), "k")
    assert answer == LookupFailed(f"lookup returned {type_name}, expected Found, NotFound or LookupUnknown")


def test_run_lookup_rejects_a_wrong_type_from_an_async_lookup() -> None:
    async def lookup(key: str) -> Any:
        return 42

    answer = run_lookup(Reconcile(finality="final", lookup=lookup), "k")
    assert isinstance(answer, LookupFailed)
    assert "int" in answer.reason


@pytest.mark.parametrize(
    ("finality", "lookup", "expected"),
    [
        ("final", lambda key: Found("v"), RecordFound("v")),
        ("final", lambda key: NotFound(), RunAgain),
        ("nonfinal", lambda key: NotFound(), Park),
        ("final", lambda key: 1 / 0, Park),
    ],
)
def test_shell_and_decision_together(finality: Any, lookup: Any, expected: Any) -> None:
    reconcile = Reconcile(finality=finality, lookup=lookup)
    record = call("reconcilable", finality=finality)
    assert decide_recovery(record, now=NOW) == NeedsLookup()
    decision = decide_recovery(record, now=NOW, lookup=run_lookup(reconcile, record.effect_key))
    if isinstance(expected, type):
        assert isinstance(decision, expected)
    else:
        assert decision == expected


class _Unprintable(BaseException):
    def __init__(self, code: int, detail: str) -> None:  # cannot be rebuilt from its args
        super().__init__(code, detail)

    def __str__(self) -> str:
        raise RuntimeError("no message")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_run_lookup_names_a_hostile_base_exception_without_raising() -> None:
    def lookup(key: str) -> Found:
        raise _Unprintable(1, "x")

    answer = run_lookup(Reconcile(finality="final", lookup=lookup), "k")
    assert isinstance(answer, LookupFailed) and answer.reason.startswith("lookup raised _Unprintable")


def test_run_lookup_turns_system_exit_into_a_failure() -> None:
    def lookup(key: str) -> Found:
        raise SystemExit(2)

    assert run_lookup(Reconcile(finality="final", lookup=lookup), "k") == LookupFailed("lookup raised SystemExit: 2")
