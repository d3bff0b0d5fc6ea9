"""The worker's side of deploy versions, on the embedded ledger with a stand-in worker: where a
run's first step places it (current, or ramping for its share), a run of another version handed
back to its version's queue, and the upgrade transition (moved with its waiting work rerouted,
pinned with its reason, or not yet while a step holds the lease)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from pydantic import BaseModel

from tests.support.waiting import eventually
from threads_celery import Agent, Permissions, Settings, Threads, tool
from threads_celery.decisions.deploys import ramp_bucket
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry, Run
from threads_celery.runtime import deploys
from threads_celery.store import Store
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow


class Note(BaseModel):
    text: str


class Renamed(BaseModel):
    body: str


def _asker(input_model: type[BaseModel] = Note) -> Agent:
    notify = tool(
        name="notify", description="Notify.", input=input_model, effect="unguarded", execute=lambda i, c: "ok"
    )
    return Agent(
        name="routing_asker",
        instructions="Ask first.",
        model=ScriptedModel([call("notify", text="x"), say("done")]),
        tools=[notify],
        permissions=Permissions(ask=["notify"]),
        versioning="upgrade",
    )


ASKER = _asker()


@dataclass
class StandIn:
    """A worker as the deploy functions see it (ports.Worker), publishing into a list."""

    store: Store
    registry: AgentRegistry
    settings: Settings = field(default_factory=Settings)
    worker_id: str = "host:1"
    sent: list[OutboxEntry] = field(default_factory=list)

    @property
    def clock(self) -> Callable[[], datetime]:
        return utcnow

    @property
    def publish(self) -> Callable[[Sequence[OutboxEntry]], None]:
        return self.sent.extend


@pytest.fixture
def threads(embedded_threads: Callable[..., Threads]) -> Threads:
    runtime = embedded_threads(reconcile_interval=None)
    runtime.register(ASKER)
    return runtime


def _waiting(threads: Threads) -> Run:
    run_id = threads.start(ASKER, "go").run_id
    eventually(lambda: threads.get_run(run_id).status == "awaiting_approval", what="the run to wait")
    return threads.get_run(run_id)


def _worker(threads: Threads, *agents: Agent) -> StandIn:
    registry = AgentRegistry()
    for agent in agents or (ASKER,):
        registry.add(agent)
    return StandIn(threads.store, registry)


def _versions(threads: Threads, current: str, ramping: str | None = None, percent: int = 0) -> None:
    with threads.store.transaction() as tx:
        for version in filter(None, (current, ramping)):
            tx.register_version(version, {}, utcnow())
        tx.set_current_version(current, utcnow())
        tx.set_ramping_version(ramping, percent)


def test_a_first_step_is_placed_on_the_current_version_and_taken_there(threads: Threads) -> None:
    run = _waiting(threads)
    assert run.deploy_version is None  # the embedded worker runs no version
    _versions(threads, "v1")
    worker = _worker(threads)
    assert deploys.route_step(worker, "v1", run, run.fence, 0) is None
    placed = threads.get_run(run.id)
    assert placed.deploy_version == "v1" and placed.deploy_policy == "upgrade"
    with threads.store.read() as tx:
        assert tx.version_marks(run.id) == [(f"step:{run.id}:0", "v1")]
    assert worker.sent == []


def test_a_first_step_of_a_run_in_the_ramp_goes_to_the_ramping_version(threads: Threads) -> None:
    run = _waiting(threads)
    _versions(threads, "v1", "v2", 100)
    worker = _worker(threads)
    routed = deploys.route_step(worker, "v1", run, run.fence, 0)
    assert routed == "routed: run is on version v2"
    assert threads.get_run(run.id).deploy_version == "v2"
    [entry] = worker.sent
    assert entry.key == f"step:{run.id}:0" and entry.queue == "threads@v2"
    with threads.store.read() as tx:  # the step waits in the outbox for v2's workers
        assert f"step:{run.id}:0" in tx.outbox_keys()
    assert 0 <= ramp_bucket(run.id) < 100


def test_a_call_of_a_run_on_another_version_is_sent_there_and_not_taken(threads: Threads) -> None:
    run = _waiting(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run.id, "v1", "pinned")
    run = threads.get_run(run.id)
    [pending] = threads.pending(run.id)
    loaded = threads.store.call_and_run(pending.effect_key)
    assert loaded is not None
    worker = _worker(threads)
    assert deploys.route_call(worker, "v2", run, loaded[0]) == "routed: run is on version v1"
    [entry] = worker.sent
    assert entry.key == pending.effect_key and entry.queue == "threads@v1"
    assert deploys.route_call(worker, "v1", run, loaded[0]) is None  # its own version takes it


def test_an_upgrade_moves_a_compatible_run_and_reroutes_its_waiting_work(threads: Threads) -> None:
    run = _waiting(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run.id, "v1", "upgrade")
        tx.insert_outbox(OutboxEntry(key=f"step:{run.id}:9", task="threads.step", args=(run.id, 9)), utcnow())
    worker = _worker(threads)
    assert deploys.upgrade_run(worker, run.id, "v2", dry_run=True).outcome == "compatible"
    assert threads.get_run(run.id).deploy_version == "v1"
    report = deploys.upgrade_run(worker, run.id, "v2")
    assert report.outcome == "moved" and report.from_version == "v1"
    moved = threads.get_run(run.id)
    assert moved.deploy_version == "v2" and moved.fence == run.fence + 1
    assert [e.queue for e in worker.sent] == ["threads@v2"]
    assert [e.type for e in threads.events(run.thread_id)][-1] == "deploy"


def test_an_upgrade_that_fails_the_check_pins_the_run_with_its_reason(threads: Threads) -> None:
    run = _waiting(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run.id, "v1", "upgrade")
    worker = _worker(threads, _asker(Renamed))
    report = deploys.upgrade_run(worker, run.id, "v2")
    assert report.outcome == "pinned" and "recorded arguments fail 'notify' in v2" in report.reason
    pinned = threads.get_run(run.id)
    assert pinned.deploy_version == "v1" and pinned.deploy_checked == "v2"
    assert pinned.deploy_pin_reason is not None and "body" in pinned.deploy_pin_reason
    with threads.store.read() as tx:
        assert tx.due_upgrades("v2", limit=10) == []  # checked against v2: not sent again
        assert tx.due_upgrades("v3", limit=10) == [(run.id, "v1")]


def test_an_upgrade_waits_while_a_step_holds_the_lease(threads: Threads) -> None:
    run = _waiting(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run.id, "v1", "upgrade")
        tx.advance_run(run.id, fence=run.fence, now=utcnow(), lease_owner="host:9",
                       lease_expires_at=utcnow() + timedelta(minutes=1))  # fmt: skip
    report = deploys.upgrade_run(_worker(threads), run.id, "v2")
    assert report.outcome == "not_yet" and "step is in flight" in report.reason
    assert threads.get_run(run.id).deploy_version == "v1"
