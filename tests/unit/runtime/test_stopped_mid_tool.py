"""A tool whose process is stopped mid-call past its lease is left before it can act.

The scenario a backlog soak found: a pool process runs a reconcilable tool that waits before its
effect, is stopped (SIGSTOP) for longer than the call's lease, the backbone's lookup finds no
effect and the call runs again elsewhere. Continued, the old execution must not make the effect
a second time: on the SIGCONT the runtime raises into the tool, and the task ends as a lost fence.
Here the test process itself is stopped and continued by a helper process, and the tool moves the
run's fence on before it waits, as the backbone does while a worker is stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import update

from threads_celery import Agent, NotFound, Reconcile, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import FenceLost
from threads_celery.records import OutboxEntry
from threads_celery.runtime import models
from threads_celery.runtime.machine import Runtime
from threads_celery.runtime.pauses import PausedPastLease, stop_if_paused
from threads_celery.settings import Settings
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.store.migrate import upgrade
from threads_celery.store.schema import runs
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions import runs as run_ledger

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX job-control signals")

LEASE_S = 1.0
STOP_S = 1.5  # past the lease, and past the half of it after which a call is no longer provably held


def _continue_self() -> None:
    """A SIGCONT as a continue after a stop delivers it (the process was not stopped)."""
    os.kill(os.getpid(), signal.SIGCONT)


def _until(deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        time.sleep(0.005)


def test_a_continue_raises_into_the_block_when_the_call_is_no_longer_held() -> None:
    with pytest.raises(PausedPastLease), stop_if_paused(lambda: False):
        _continue_self()
        _until(5.0)  # the handler raises long before this ends


def test_a_continue_changes_nothing_while_the_call_is_held_or_outside_the_block() -> None:
    asked: list[bool] = []

    def held() -> bool:
        asked.append(True)
        return True

    with stop_if_paused(held):
        _continue_self()
        _until(0.05)
    assert asked, "the handler asked"
    _continue_self()  # no block: nothing to ask, nothing raised
    _until(0.05)
    assert len(asked) == 1


def test_a_handler_that_was_there_before_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import threads_celery.runtime.pauses as pauses

    seen: list[int] = []
    original = signal.getsignal(signal.SIGCONT)
    monkeypatch.setattr(pauses, "_installed", False)
    monkeypatch.setattr(pauses, "_previous", None)
    signal.signal(signal.SIGCONT, lambda signum, frame: seen.append(signum))
    try:
        with stop_if_paused(lambda: True):
            _continue_self()
            _until(0.05)
        assert seen == [signal.SIGCONT]
    finally:
        signal.signal(signal.SIGCONT, original)


def test_off_the_main_thread_the_block_runs_unguarded() -> None:
    outcome: list[str] = []

    def body() -> None:
        with stop_if_paused(lambda: False):
            outcome.append("ran")

    worker = threading.Thread(target=body)
    worker.start()
    worker.join(10)
    assert outcome == ["ran"]


# -- a real stop of this process in the middle of a tool --------------------------------------

EVENTS: list[str] = []
STORE: list[Store] = []


def _taken_over(run_id: str) -> None:
    """What the backbone does once the lease lapsed: the run's fence moves on."""
    with STORE[0].transaction() as tx:
        tx.conn.execute(update(runs).where(runs.c.id == run_id).values(fence=runs.c.fence + 1))


class ChargeIn(BaseModel):
    amount: int


def _stop_me_for_a_while() -> subprocess.Popen[bytes]:
    """Another process stops this one (the whole process, every thread) for STOP_S, then
    continues it, as ``kill -STOP`` and ``kill -CONT`` would."""
    script = f"sleep 0.2; kill -STOP {os.getpid()}; sleep {STOP_S}; kill -CONT {os.getpid()}"
    return subprocess.Popen(["sh", "-c", script])


def _charge(inp: ChargeIn, ctx: Any) -> str:
    EVENTS.append("started")
    _taken_over(ctx.run_id)
    helper = _stop_me_for_a_while()
    try:
        _until(STOP_S + 3.0)  # waiting on the provider; stopped meanwhile
        EVENTS.append("charged")
        return "charged"
    finally:
        helper.wait(10)


async def _charge_async(inp: ChargeIn, ctx: Any) -> str:
    EVENTS.append("started")
    _taken_over(ctx.run_id)
    helper = _stop_me_for_a_while()
    try:
        end = time.monotonic() + STOP_S + 3.0
        while time.monotonic() < end:
            await asyncio.sleep(0.005)
        EVENTS.append("charged")
        return "charged"
    finally:
        helper.wait(10)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(create_store_engine(parse_database_url(f"sqlite:///{tmp_path / 'stop.db'}")))
    upgrade(store.engine)
    STORE[:] = [store]
    yield store
    STORE.clear()
    store.dispose()


def _run_until_the_call(store: Store, execute: Any, effect: str) -> tuple[Runtime, OutboxEntry]:
    extra: dict[str, Any] = {
        "reconcilable": {"reconcile": Reconcile(finality="final", lookup=lambda key: NotFound())},
        "idempotent": {"dedup_window_ms": 60_000},
    }.get(effect, {})
    charge = tool(name="charge", description="Charge.", input=ChargeIn, effect=effect, execute=execute, **extra)
    agent = Agent(name="charger", instructions="Charge.", tools=[charge], permissions=Permissions.allow_all(),
                  model=ScriptedModel([call("charge", amount=5), say("done")]))  # fmt: skip
    registry = AgentRegistry()
    registry.add(agent)
    queue: list[OutboxEntry] = []
    runtime = Runtime(store, registry, publish=queue.extend, settings=Settings(tool_lease_s=LEASE_S))
    with store.transaction() as tx:
        tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), run_ledger.utcnow())
        _run, entries = run_ledger.submit_run(
            tx, agent=agent.name, config_hash=agent.config_hash(), message="go", now=run_ledger.utcnow()
        )
    runtime.run_step(*entries[0].args)
    (tool_entry,) = queue
    assert tool_entry.task == "threads.tool"
    return runtime, tool_entry


@pytest.mark.parametrize("effect", ["reconcilable", "unguarded", "idempotent"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_stopped_past_its_lease_does_not_act_when_continued(store: Store, effect: str, kind: str) -> None:
    EVENTS.clear()
    runtime, entry = _run_until_the_call(store, _charge if kind == "sync" else _charge_async, effect)
    with pytest.raises(FenceLost):
        runtime.run_tool(*entry.args)
    assert EVENTS == ["started"], "continued, the old execution must not reach its effect"
    # The loop a coroutine tool ran on is clean: nothing of the left call goes on in the next one.
    assert models.run_coroutine(asyncio.sleep(0, result="next")) == "next"
    assert EVENTS == ["started"]


def test_a_read_only_tool_stopped_past_its_lease_goes_on(store: Store) -> None:
    """A read changes nothing: it may finish, and its late result is refused by the fence."""
    EVENTS.clear()
    runtime, entry = _run_until_the_call(store, _charge, "read_only")
    with pytest.raises(FenceLost):
        runtime.run_tool(*entry.args)
    assert EVENTS == ["started", "charged"]
