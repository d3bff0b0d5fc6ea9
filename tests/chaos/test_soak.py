"""Chaos soak: a backlog of runs while workers are killed and frozen and the services restart.

``RUNS`` runs (``CHAOS_SOAK_RUNS``, default 200, what CI runs) of every effect class, their tools
sleeping 50-300 ms, are all started at once, as the workers boot: hundreds of messages wait in
Redis. Two prefork workers and a real ``celery -A tasks beat`` (0.5 s ticks, 2 s leases) work
through them while a chaos thread strikes every 1.5-3 s, alternately SIGKILLing the pool process
that most recently started a tool call and a whole worker (replaced at once), and, as the runs
settle:

- SIGSTOPs a worker while it holds run leases (twice, and again up to six times until a late
  write has met the fence), for longer than its lease: the backbone
  re-dispatches its runs, and when it is resumed every late write it tries is refused by the
  fence (counted: there must be some, and every one of them refused);
- restarts the private Redis (``SHUTDOWN NOSAVE``: every queued message is lost) and then the
  private PostgreSQL (fast shutdown: every connection is cut).

At the end every run must be completed, or parked with a reason by an effect class that may park;
no effect that must not repeat ran twice; idempotent repeats carried the call's own key inside its
window; reconcilable calls interrupted after their effect were settled by the lookup; and no call
has two results. It prints a summary: runs, kills, freezes, refused late writes, the peak of the
work queue, and the kill-to-re-dispatch times of the calls a killed worker held.
``CHAOS_SOAK_SEED`` replays the plan and the chaos thread's choices. A bigger soak
(``CHAOS_SOAK_LARGE=1``: 1,000 runs) is not part of the default run.
"""

from __future__ import annotations

import os
import random
import re
import socket
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from tests.chaos import chaos_agents
from tests.chaos.soak_checks import REDISPATCHED_AT, SETTLED, check_runs, describe_stuck, statuses
from tests.support.processes import queued_messages

if TYPE_CHECKING:  # the conftest is pytest's to import; tests only name its types
    from tests.chaos.conftest import ChaosCluster, WorkerProcess

RUNS = int(os.environ.get("CHAOS_SOAK_RUNS", "200"))
LARGE_RUNS = 1000
DEADLINE_S = float(os.environ.get("CHAOS_SOAK_DEADLINE_S", "300"))
SEED = int(os.environ.get("CHAOS_SOAK_SEED", str(random.randrange(1 << 30))))
LEASE_S = 2.0  # DEFAULT_CHAOS_ENV's leases
FREEZE_S = 5.0  # longer than a lease plus a few ticks: the frozen worker's runs are re-dispatched
# agent -> weight: every effect class, and a reply with two calls (read_only then idempotent)
MIX = {
    "read_only": 3,
    "idempotent": 3,
    "idempotent_tiny": 1,
    "reconcilable": 3,
    "reconcilable_nonfinal": 1,
    "unguarded": 3,
    "mixed": 2,
}
# When (fraction of runs settled) each outage happens.
FREEZE_AT = (0.05, 0.3)
MAX_FREEZES = 6
REDIS_RESTART_AT = 0.3
POSTGRES_RESTART_AT = 0.5


@dataclass
class Freeze:
    """One SIGSTOP: the worker, when, and the runs its pool processes held leases on."""

    worker: WorkerProcess
    at: float
    held: list[str]  # run ids
    owners: list[str]  # the lease owners (host:pid) of its pool processes
    log_offset: int  # the length of its log when it was frozen: what follows is its late work
    resumed_at: float = 0.0
    log_end: int = 0  # the length of its log a few seconds after it resumed


@dataclass
class Chaos:
    """The soak's adversary, on a thread of its own (see the module docstring)."""

    cluster: ChaosCluster
    workers: list[WorkerProcess]
    rng: random.Random
    settled_fraction: float = 0.0
    child_kills: int = 0
    whole_kills: int = 0
    replaced: int = 0
    redis_restarts: int = 0
    postgres_restarts: int = 0
    peak_queued: int = 0
    freezes: list[Freeze] = field(default_factory=list)
    #: (kill time, the lease owners of its pool processes) per whole-worker kill
    whole_kill_log: list[tuple[float, list[str]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _strikes: int = 0
    _ready_at: dict[int, float] = field(default_factory=dict)
    _spared_until: dict[int, float] = field(default_factory=dict)
    _fenced_seen: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        next_strike = time.monotonic() + self.rng.uniform(1.5, 3.0)
        while not self._stop.wait(0.1):
            try:
                self._sample_queue()
                self._replace_dead()
                self._outages()
                if time.monotonic() >= next_strike:
                    # Nothing to strike yet (workers booting, frozen or restarting): soon again.
                    pause = self.rng.uniform(1.5, 3.0) if self._strike() else 0.3
                    next_strike = time.monotonic() + pause
            except Exception as exc:  # noqa: BLE001 - a miss (a process that just died) is fine
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()

    # -- workers ----------------------------------------------------------------------------

    def _sample_queue(self) -> None:
        self.peak_queued = max(self.peak_queued, queued_messages(self.cluster.broker_url))

    def _replace_dead(self) -> None:
        for slot, worker in enumerate(self.workers):
            if not worker.alive():
                self.workers[slot] = self.cluster.start_worker(wait=False)
                self.replaced += 1
            elif id(worker) not in self._ready_at and re.search(
                rf"{re.escape(worker.name)}@\S+ ready\.", worker.log_text()
            ):
                self._ready_at[id(worker)] = time.monotonic()

    def _strikable(self, worker: WorkerProcess) -> bool:
        ready = self._ready_at.get(id(worker))
        return (
            worker.alive()
            and not worker.stopped
            and ready is not None
            and time.monotonic() - ready >= 1.0
            and time.monotonic() >= self._spared_until.get(id(worker), 0.0)
        )

    def _strike(self) -> bool:
        """Kill a pool process or a whole worker, whichever kind is behind; False if neither could be."""
        self._strikes += 1
        # A whole worker only while every worker is up and none is frozen: one always keeps
        # serving (and running Beat's ticks) while the other restarts.
        whole_ok = all(self._strikable(w) for w in self.workers)
        if not (whole_ok and self.whole_kills <= self.child_kills):
            busy = self._busy_child()
            if busy is not None:
                worker, pid = busy
                worker.kill_child(pid)
                self.child_kills += 1
                return True
            if not whole_ok:
                return False
        slot = self.rng.randrange(len(self.workers))
        victim = self.workers[slot]
        owners = self._owners(victim)
        victim.kill()
        self.whole_kill_log.append((time.time(), owners))
        self.whole_kills += 1
        self.workers[slot] = self.cluster.start_worker(wait=False)
        return True

    def _busy_child(self) -> tuple[WorkerProcess, int] | None:
        children = {pid: w for w in self.workers if self._strikable(w) for pid in w.child_pids()}
        for entry in reversed(self.cluster.ledger.entries()[-20:]):
            if entry.kind == "start" and entry.pid in children:
                return children[entry.pid], entry.pid
        if not children:
            return None
        pid = self.rng.choice(sorted(children))
        return children[pid], pid

    # -- outages ----------------------------------------------------------------------------

    def _outages(self) -> None:
        services = self.cluster.services
        assert services is not None
        if self._stop.is_set():
            return  # the soak is over: no outage after its last run settled
        if len(self.freezes) < len(FREEZE_AT):
            if self.settled_fraction >= FREEZE_AT[len(self.freezes)]:
                self._freeze()
        elif len(self.freezes) < MAX_FREEZES and not self._fenced_late_write_seen():
            # Every worker frozen so far was caught inside a transaction (its row stays locked,
            # so nothing was fenced): freeze again until a late write meets the fence.
            self._freeze()
        if not self.redis_restarts and self.settled_fraction >= REDIS_RESTART_AT:
            services.redis.stop()  # SHUTDOWN NOSAVE: the queued messages are gone
            time.sleep(1.0)
            services.redis.start()
            self.redis_restarts += 1
        if not self.postgres_restarts and self.settled_fraction >= POSTGRES_RESTART_AT:
            services.postgres.stop("fast")
            time.sleep(1.0)
            services.postgres.start()
            self.postgres_restarts += 1

    @staticmethod
    def _owners(worker: WorkerProcess) -> list[str]:
        """The lease owners of the worker's pool processes (the runtime's is ``host:pid``)."""
        return [f"{socket.gethostname()}:{pid}" for pid in worker.child_pids()]

    def _claims(self, worker: WorkerProcess) -> list[str]:
        """The runs whose lease one of the worker's pool processes holds while it executes a
        claimed tool call (inside the tool, not inside a transaction)."""
        owners = self._owners(worker)
        with self.cluster.threads.store.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "select r.id from runs r join tool_calls c on c.run_id = r.id and c.status = 'started' "
                    "where r.lease_owner = any(:owners) and r.status = 'running'"
                ),
                {"owners": owners},
            )
            return [row.id for row in rows]

    def _fenced_late_write_seen(self) -> bool:
        if not self._fenced_seen and self.freezes and self.freezes[-1].log_end:
            self._fenced_seen = _late_writes(self.cluster, self)["refused"] > 0
        return self._fenced_seen

    def _freeze(self) -> None:
        """SIGSTOP a worker while it holds run leases, for FREEZE_S (longer than a lease: the
        backbone re-dispatches its runs meanwhile), then resume it and spare it from kills while
        it tries its late writes."""
        for worker in self.rng.sample(self.workers, len(self.workers)):
            if not self._strikable(worker) or not self._claims(worker):
                continue
            worker.stop()
            held = self._claims(worker)  # what it holds now that it cannot move
            if held:
                break
            worker.cont()
        else:
            return  # nobody holds a lease right now: try again on the next loop
        freeze = Freeze(worker, time.time(), held, self._owners(worker), len(worker.log_text()))
        self.freezes.append(freeze)
        self._stop.wait(FREEZE_S)
        worker.cont()
        freeze.resumed_at = time.time()
        self._spared_until[id(worker)] = time.monotonic() + 10.0
        # Its late writes come within a second or two (the tools sleep at most 0.3 s more).
        self._stop.wait(3.0)
        freeze.log_end = len(worker.log_text())


def _soak(cluster: ChaosCluster, runs: int) -> None:
    rng = random.Random(SEED)
    deadline_s = DEADLINE_S * max(1.0, runs / RUNS)  # a bigger soak gets proportionally longer
    print(f"\nchaos soak: {runs} runs, seed {SEED} (CHAOS_SOAK_SEED={SEED} replays the plan and the chaos)")
    assert cluster.services is not None, "the soak restarts the private Redis and PostgreSQL"
    # Workers and Beat boot while every run is started at once: a backlog from the first second.
    workers = [cluster.start_worker(wait=False) for _ in range(2)]
    cluster.start_beat(wait=False)
    agents = {**chaos_agents.AGENTS, "mixed": chaos_agents.mixed_agent}
    plan = rng.choices(list(MIX), weights=list(MIX.values()), k=runs)
    started: dict[str, tuple[str, str]] = {}  # run id -> (agent kind, ref)
    for kind in plan:
        ref = uuid.uuid4().hex[:12]
        seconds = round(rng.uniform(0.05, 0.3), 3)
        sleep_first = kind.startswith("reconcilable") and rng.random() < 0.5
        handle = cluster.threads.start(
            agents[kind],
            chaos_agents.message(ref, seconds=seconds, repeat_seconds=seconds, sleep_first=sleep_first),
        )
        started[handle.run_id] = (kind, ref)
    chaos = Chaos(cluster, workers, random.Random(SEED + 1))
    chaos._sample_queue()  # the backlog right after the burst
    for worker in workers:
        worker.wait_ready()

    chaos_thread = threading.Thread(target=chaos.run, name="chaos", daemon=True)
    pending = set(started)
    final: dict[str, str] = {}
    began = time.monotonic()
    chaos_thread.start()
    try:
        while pending and time.monotonic() - began < deadline_s:
            for run_id, status in statuses(cluster, pending).items():
                if status in SETTLED:
                    final[run_id] = status
                    pending.discard(run_id)
            chaos.settled_fraction = len(final) / runs
            time.sleep(0.2)
    finally:
        chaos.stop()
        chaos_thread.join(timeout=30)
    elapsed = time.monotonic() - began
    # Connections pooled before the PostgreSQL restart were cut by it: start the checks afresh.
    cluster.threads.store.engine.dispose()

    report = check_runs(cluster, started, final)
    late = _late_writes(cluster, chaos)
    recovery = _recovery_times(cluster, chaos)
    print(_table(report, chaos, late, recovery, elapsed))
    assert not pending, f"{len(pending)} runs unsettled after {deadline_s:g} s:\n" + describe_stuck(cluster, pending)
    assert not report["problems"], "\n".join(report["problems"][:40])
    assert chaos.whole_kills >= 1 and chaos.child_kills >= 1, "the soak must kill whole workers and pool processes"
    assert chaos.redis_restarts == 1 and chaos.postgres_restarts == 1, "Redis and PostgreSQL restart mid-soak"
    assert chaos.freezes, "a worker must be frozen while it holds calls"
    assert chaos.peak_queued >= 100, f"hundreds of messages should wait in Redis (peak {chaos.peak_queued})"
    if runs > RUNS:
        # The large soak freezes (up to MAX_FREEZES times) until a late write meets the fence.
        # The CI-sized one settles in about 30 s and its freeze does not always catch a call in
        # flight, so there it only reports the count; test_worker_kills'
        # test_frozen_worker_is_fenced_off_when_it_resumes proves the refusal on every CI run.
        assert late["refused"] > 0, f"the frozen workers' late writes must be seen and refused: {late}"
    assert not late["accepted"], f"late writes of a frozen worker were accepted: {late['accepted']}"


def test_soak_backlog_under_kills_freezes_and_restarts(cluster: ChaosCluster) -> None:
    _soak(cluster, RUNS)


@pytest.mark.skipif(not os.environ.get("CHAOS_SOAK_LARGE"), reason="the large soak runs with CHAOS_SOAK_LARGE=1")
def test_large_soak_backlog_under_kills_freezes_and_restarts(cluster: ChaosCluster) -> None:
    _soak(cluster, LARGE_RUNS)


LATE_OUTCOME = re.compile(r"threads\.(?:tool|step)(?: [^\[\s]+)?\[([^\]]+)\] succeeded in ([\d.e-]+)s: '([^']*)'")


REDISPATCHED = re.compile(r"run (run_\w+): lease of (\S+) expired; re-dispatching")


def _late_writes(cluster: ChaosCluster, chaos: Chaos) -> dict[str, Any]:
    """What each frozen worker did, once resumed, with the runs it held leases on.

    A late write is one for a run the backbone re-dispatched while the worker was frozen (a
    worker's log says ``lease of <its host:pid> expired``): every one must have been refused by
    the fence ('fence lost'). The frozen worker's own attempt is what ran across the freeze
    (Celery reports it as taking at least FREEZE_S; work taken up after the resume takes well
    under a second). A run the worker froze *inside a transaction* keeps its row locked, so the
    backbone (SKIP LOCKED) leaves it alone and the worker's commit is not late: those are
    counted apart.
    """
    logs = "".join(w.log_text() for w in cluster.workers())
    refused: list[str] = []
    accepted: list[str] = []
    not_fenced: list[str] = []
    for freeze in chaos.freezes:
        fenced = {run for run, owner in REDISPATCHED.findall(logs) if owner in freeze.owners}
        after = freeze.worker.log_text()[freeze.log_offset : freeze.log_end or None]
        for task_id, seconds, outcome in LATE_OUTCOME.findall(after):
            run_id = next((r for r in freeze.held if r in task_id), None)
            if float(seconds) < FREEZE_S - 0.5 or run_id is None:
                continue
            line = f"{task_id} ({seconds} s): {outcome}"
            if run_id not in fenced:
                not_fenced.append(line)
            else:
                (refused if outcome == "fence lost" else accepted).append(line)
    return {
        "held": sum(len(f.held) for f in chaos.freezes),
        "refused": len(refused),
        "accepted": accepted,
        "not_fenced": not_fenced,
        "all_refusals": len(cluster.fence_refusals()),
    }


def _recovery_times(cluster: ChaosCluster, chaos: Chaos) -> list[float]:
    """Seconds from each whole-worker kill to each re-dispatch of a run it held (a worker's log
    says ``lease of <its host:pid> expired; re-dispatching``; log times are local)."""
    redispatched: dict[str, list[float]] = {}
    for worker in cluster.workers():
        for stamp, owner in REDISPATCHED_AT.findall(worker.log_text()):
            at = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
            redispatched.setdefault(owner, []).append(at)
    times = []
    for killed_at, owners in chaos.whole_kill_log:
        for owner in owners:
            times.extend(at - killed_at for at in redispatched.get(owner, []) if at >= killed_at)
    return times


def _table(
    report: dict[str, Any],
    chaos: Chaos,
    late: dict[str, Any],
    recovery: list[float],
    elapsed: float,
) -> str:
    classes = list(chaos_agents.TOOLS)
    recovered = (
        f"median {statistics.median(recovery):.1f} s, max {max(recovery):.1f} s (n={len(recovery)})"
        if recovery
        else "none measured"
    )
    rows = [
        ("runs (started at once)", report["runs"]),
        ("completed", report["statuses"]["completed"]),
        ("parked (with a reason)", report["statuses"]["parked"]),
        (
            "other statuses",
            sum(n for s, n in report["statuses"].items() if s not in ("completed", "parked")),
        ),
        ("peak messages queued in Redis", chaos.peak_queued),
        ("tool calls / effects in the ledger", f"{report['calls']} / {report['effects']}"),
        ("kills: pool process / whole worker", f"{chaos.child_kills} / {chaos.whole_kills}"),
        ("workers that died otherwise, replaced", chaos.replaced),
        ("freezes (SIGSTOP) / run leases held", f"{len(chaos.freezes)} / {late['held']}"),
        ("late writes refused by the fence (frozen)", late["refused"]),
        ("late writes accepted (must be 0)", len(late["accepted"])),
        ("frozen inside a transaction, committed on resume", len(late["not_fenced"])),
        ("fence refusals in all worker logs", late["all_refusals"]),
        ("Redis / PostgreSQL restarts", f"{chaos.redis_restarts} / {chaos.postgres_restarts}"),
        ("whole-worker kill to re-dispatch of its runs", recovered),
        *[(f"reruns (effect > 1): {c}", report["reruns"][c]) for c in classes],
        *[(f"parks: {c}", report["parks"][c]) for c in classes],
        *[(f"settled by lookup: {c}", report["found"][c]) for c in ("reconcilable", "reconcilable_nonfinal")],
        ("duplicate unguarded effects (must be 0)", report["unguarded_duplicates"]),
        ("elapsed", f"{elapsed:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = ["", "chaos soak summary", "-" * (width + 12)]
    lines += [f"{name:<{width}}  {value!s:>8}" for name, value in rows]
    if chaos.errors:
        lines.append(f"chaos misses: {len(chaos.errors)} (e.g. {chaos.errors[0]})")
    return "\n".join(lines)
