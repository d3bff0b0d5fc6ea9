"""A worker paused between its claim and the call must not act once the backbone moved on.

The scenario a backlog soak found: a pool process commits the claim of a reconcilable call, is
stopped (SIGSTOP) before the tool runs, the backbone fences it off, the lookup says "not found"
and the call runs again elsewhere. When the stopped process resumes it must not run the tool a
second time: the effect would happen twice and only the late result write would be refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import update

import threads_celery.runtime.machine as runtime_module
from tests.support.waiting import eventually
from threads_celery import Agent, NotFound, Reconcile, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.store.schema import runs, tool_calls
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow

EFFECTS: list[int] = []


class ChargeIn(BaseModel):
    amount: int


def _charge(inp: ChargeIn, ctx: Any) -> str:
    EFFECTS.append(ctx.attempt)
    return f"charged {inp.amount} (attempt {ctx.attempt})"


charge = tool(
    name="charge",
    description="Charge the card.",
    input=ChargeIn,
    effect="reconcilable",
    reconcile=Reconcile(finality="final", lookup=lambda key: NotFound()),
    execute=_charge,
)


def _agent(effect_tool: Any) -> Agent:
    return Agent(
        name="charger",
        instructions="Charge.",
        model=ScriptedModel([call(effect_tool.name, amount=5), say("done")]),
        tools=[effect_tool],
        permissions=Permissions.allow_all(),
    )


@pytest.fixture
def threads(embedded_threads: Callable[..., Threads]) -> Threads:
    EFFECTS.clear()
    return embedded_threads(reconcile_interval=None, concurrency=1)


def _pause_after_the_first_claim(threads: Threads, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make the first claim look like its process was stopped past its lease meanwhile.

    After the claim commits, the ledger's leases are moved into the past (as time passing would
    do), the backbone ticks (fencing the run off and re-dispatching the call), and the runtime's
    monotonic clock jumps by a lease, as it does across a SIGSTOP.
    """
    runtime = threads.app.threads_runtime.get()
    lease_s = runtime.settings.tool_lease_s
    offset = [0.0]
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + offset[0], sleep=time.sleep)
    monkeypatch.setattr(runtime_module, "time", clock)
    claim = runtime._claim_call
    paused = threading.Event()

    def claim_then_pause(run: Any, call_row: Any, now: Any) -> int | None:
        fence = claim(run, call_row, now)
        if paused.is_set():
            return fence
        paused.set()
        past = utcnow() - timedelta(seconds=1)
        with threads.store.transaction() as tx:
            tx.conn.execute(update(runs).where(runs.c.id == run.id).values(lease_expires_at=past))
            tx.conn.execute(
                update(tool_calls).where(tool_calls.c.effect_key == call_row.effect_key).values(lease_expires_at=past)
            )
        assert threads.reconcile()["expired_runs"] == 1
        offset[0] += lease_s
        return fence

    monkeypatch.setattr(runtime, "_claim_call", claim_then_pause)
    return paused


def test_a_reconcilable_call_paused_after_its_claim_runs_once(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    paused = _pause_after_the_first_claim(threads, monkeypatch)
    handle = threads.start(_agent(charge), "charge 5")
    run = threads.wait(handle.run_id, 30)
    assert paused.is_set()
    assert run.status == "completed"
    # The lookup found nothing, so the backbone's attempt ran it; the paused one did not.
    assert EFFECTS == [2]
    results = [m.text for m in threads.messages(run.thread_id) if m.role == "tool"]
    assert results == ["charged 5 (attempt 2)"]


def test_an_unguarded_call_paused_after_its_claim_never_acts(threads: Threads, monkeypatch: pytest.MonkeyPatch) -> None:
    unguarded = tool(name="send", description="Send it.", input=ChargeIn, effect="unguarded", execute=_charge)
    _pause_after_the_first_claim(threads, monkeypatch)
    handle = threads.start(_agent(unguarded), "send 5")
    eventually(
        lambda: threads.get_run(handle.run_id).status == "parked",
        timeout=30,
        what="the run parking",
        detail=lambda: threads.get_run(handle.run_id).status,
    )
    # The backbone parked it for a person (it may have acted); the paused worker never did.
    assert EFFECTS == []
    assert [p.effect_key for p in threads.parked()] == [f"{handle.run_id}:0:0"]


def test_a_claim_held_within_half_its_lease_needs_no_extra_round_trip(threads: Threads) -> None:
    runtime = threads.app.threads_runtime.get()
    renewals: list[int] = []

    def renew() -> bool:
        renewals.append(1)
        return True

    assert runtime._claim_still_held(time.monotonic(), renew)
    assert renewals == []
    assert runtime._claim_still_held(time.monotonic() - runtime.settings.tool_lease_s, renew)
    assert renewals == [1]
