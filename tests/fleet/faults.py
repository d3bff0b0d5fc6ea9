"""The faults, and the backlog soak each one lands in.

A scenario starts ``runs`` runs of every effect class at once (the chaos suite's agents, their tools
sleeping 0.4-1.2 s, so the workers hold many runs at any moment), lets a tenth of them settle, and
injects its fault on the worker host whose pool processes hold the most claimed tool calls (or on
Beat, the API, PgBouncer). It holds the fault for ``HOLD_S`` (longer than a lease plus two ticks,
than the workers' TCP retransmissions and keepalives, and than PgBouncer's reconnect), heals it,
and waits for every run to settle. Then the invariants, per fault:

- no run lost: every run settles, completed or parked with a reason where its effect class may
  park (:func:`tests.chaos.soak_checks.check_runs`, as the chaos soak);
- no unguarded effect twice, no call with two results, none completed without its result in the
  thread (no half-written step);
- every late write of the cut-off host is refused by the fence (``'fence lost'`` in its workers'
  logs, counted; more than none where the fault makes late writes);
- runs move again within a lease plus two ticks: the first re-dispatch of a run the cut-off host
  held, after the fault began, and the first run settled after the heal, measured and reported
  against that bound (a report, not an assertion: timings on a shared 2-core machine are not
  facts).

:func:`report_table` prints one table per fault.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos import chaos_agents
from tests.chaos.soak_checks import REDISPATCHED_AT, SETTLED, check_runs, describe_stuck, statuses
from tests.fleet.cluster import LEASE_S, TICK_S, WORKER_HOSTS, Fleet
from tests.support.processes import WorkerProcess

HOLD_S = 15.0
BOUND_S = LEASE_S + 2 * TICK_S
MIX = ["read_only", "idempotent", "reconcilable", "unguarded", "unguarded", "idempotent_tiny"]


@dataclass
class Fault:
    """One fault: what it does to the fleet, what it undoes, and whether it makes late writes."""

    name: str
    apply: Callable[[Fleet, str], None]
    heal: Callable[[Fleet, str], None] = lambda fleet, _host: fleet.network.heal()
    late_writes: bool = False  # the cut-off host finishes work it can only commit after the heal
    target: str | None = None  # a fixed host; None: the busiest worker host
    through_api: int = 0  # runs started through the API while the fault holds


def _flap(fleet: Fleet, host: str) -> None:
    """Cut and restore ``host``'s link to PostgreSQL every second, for the whole hold."""
    ends = time.monotonic() + HOLD_S
    while time.monotonic() < ends:
        fleet.network.cut(host, "db")
        time.sleep(1.0)
        fleet.network.heal()
        time.sleep(1.0)


def _slow_and_lossy(fleet: Fleet, host: str) -> None:
    fleet.set_delay_ms(host, 200)
    fleet.network.lose(host, 0.05)


def _heal_slow(fleet: Fleet, host: str) -> None:
    fleet.set_delay_ms(host, 0)
    fleet.network.heal()


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("worker cut from PostgreSQL", lambda fl, h: fl.network.cut(h, "db"), late_writes=True),
        Fault("worker cut from the broker", lambda fl, h: fl.network.cut(h, "broker")),
        Fault("Beat cut off", lambda fl, h: fl.network.isolate(h), target="beat"),
        Fault("API cut from the broker", lambda fl, h: fl.network.cut(h, "broker"), target="api", through_api=10),
        Fault(
            "one-way partition (worker hears nothing from PostgreSQL)",
            lambda fl, h: fl.network.cut(h, "db", outbound=False),
            late_writes=True,
        ),
        Fault("flapping link to PostgreSQL", _flap),
        Fault("200 ms latency and 5% loss on a worker's link", _slow_and_lossy, _heal_slow, target="w3"),
        Fault("PgBouncer restarted", lambda fl, _h: fl.restart_bouncer(), lambda _fl, _h: None, target="db"),
        # The broker down for the hold, then started again on its data: RabbitMQ's quorum queues keep
        # their messages; Redis (no persistence) comes back empty, and the backbone re-publishes.
        Fault("broker restarted", lambda fl, _h: fl.stop_broker(), lambda fl, _h: fl.start_broker(), target="broker"),
        # Bad input: a database that answers slower than a lease.
        Fault(
            "PostgreSQL answering slower than a lease",
            lambda fl, h: fl.set_delay_ms(h, LEASE_S * 1000 + 1500),
            lambda fl, h: fl.set_delay_ms(h, 0),
            late_writes=True,
            target="w3",
        ),
    )
}


@dataclass
class Outcome:
    """What one scenario saw: the table's rows, and the problems that fail it."""

    fault: Fault
    runs: int
    target: str = ""
    rows: list[tuple[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _owners(workers: list[WorkerProcess]) -> list[str]:
    return [f"{socket.gethostname()}:{pid}" for worker in workers for pid in worker.child_pids()]


def _claims(fleet: Fleet, workers: list[WorkerProcess]) -> list[str]:
    owners = _owners(workers)
    if not owners:
        return []
    rows = fleet.query(
        "select r.id from runs r join tool_calls c on c.run_id = r.id and c.status = 'started' "
        "where r.lease_owner = any(:owners) and r.status = 'running'",
        {"owners": owners},
    )
    return [row.id for row in rows]


def _log_time(stamp: str) -> float:
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000


def _half_written(fleet: Fleet) -> list[str]:
    """Calls recorded completed whose result never reached their thread: a step half written."""
    rows = fleet.query(
        "select c.effect_key from tool_calls c join runs r on r.id = c.run_id "
        "where c.status = 'completed' and not exists (select 1 from messages m where m.thread_id = r.thread_id "
        "and m.role = 'tool' and m.parts->'tool_result'->>'call_id' = c.call_id)"
    )
    return [f"call {row.effect_key} completed without its result in the thread" for row in rows]


#: A task's end in a worker's log: its local time, its id (which holds the run's id) and its outcome.
TASK_END = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/[^\]]+\] Task threads\.(?:tool|step)(?: \S+)?"
    r"\[([^\]]+)\] succeeded in [\d.e-]+s: '([^']*)",
    re.M,
)


def _late_writes(fleet: Fleet, held: list[str], since: float) -> tuple[int, int]:
    """The cut-off host's late writes for the runs it held, and how they were refused.

    A late write is the commit of work done under a lease the host no longer holds. It reaches the
    ledger in one of two ways: the worker's own commit, retried in process while the store is
    away, lands after the lease was taken over, and the fence refuses it (``'fence lost'``); or the
    worker gave up, Celery retried its task, and the retry (on whichever worker takes it) finds
    the ledger moved on and does nothing (``'skipped: ...'``). Both are counted, from every
    worker's log after the fault began.
    """
    fenced = skipped = 0
    for worker in fleet.workers():
        for stamp, task_id, result in TASK_END.findall(worker.log_text()):
            if _log_time(stamp) < since or not any(run_id in task_id for run_id in held):
                continue
            if result == "fence lost":
                fenced += 1
            elif result.startswith("skipped:"):
                skipped += 1
    return fenced, skipped


def run_scenario(
    fleet: Fleet,
    fault: Fault,
    workers: list[WorkerProcess],
    runs: int,
    seed: int,
    tool_seconds: tuple[float, float] = (0.4, 1.2),
) -> Outcome:
    rng = random.Random(seed)
    outcome = Outcome(fault, runs)
    started: dict[str, tuple[str, str]] = {}
    for kind in rng.choices(MIX, k=runs):
        ref = uuid.uuid4().hex[:12]
        seconds = round(rng.uniform(*tool_seconds), 3)
        handle = fleet.threads.start(
            chaos_agents.AGENTS[kind], chaos_agents.message(ref, seconds=seconds, repeat_seconds=0.1)
        )
        started[handle.run_id] = (kind, ref)
    pending, final = set(started), {}
    peak = 0

    def poll() -> None:
        nonlocal peak
        peak = max(peak, fleet.queued() or 0)
        for run_id, status in statuses(fleet, pending).items():
            if status in SETTLED:
                final[run_id] = status
                pending.discard(run_id)

    began = time.monotonic()
    while len(final) < runs // 10 and time.monotonic() - began < 120:
        poll()
        time.sleep(0.2)

    if fault.target is None:  # the busiest worker host
        by_host = {h: [w for w in workers if w.alive() and fleet.host_of(w) == h] for h in WORKER_HOSTS}
        target = max(WORKER_HOSTS, key=lambda h: len(_claims(fleet, by_host[h])))
    else:
        target = fault.target
    outcome.target = target
    cut_workers = [w for w in workers if fleet.hosts_of.get(id(w)) == target]
    held = _claims(fleet, cut_workers)
    owners = _owners(cut_workers)
    settled_before = len(final)
    fault_at = time.time()
    fault.apply(fleet, target)
    hold_ends = time.monotonic() + HOLD_S
    # Runs started through the API meanwhile, from a thread of their own: each may wait for the
    # broker's timeout, and the soak is watched all the same.
    answers: list[tuple[int, str | None, str]] = []

    def through_api() -> None:
        for _ in range(fault.through_api):
            ref = uuid.uuid4().hex[:12]
            code, run_id = fleet.api_start("chaos_read_only", chaos_agents.message(ref, seconds=0.2))
            answers.append((code, run_id, ref))

    api_thread = threading.Thread(target=through_api, name="fleet-api-starts", daemon=True)
    api_thread.start()
    while time.monotonic() < hold_ends or api_thread.is_alive():
        poll()
        time.sleep(0.2)
    api_thread.join()
    for _code, run_id, ref in answers:
        if run_id is not None:
            started[run_id] = ("read_only", ref)
            pending.add(run_id)
    if answers:
        codes = [code for code, _, _ in answers]
        outcome.rows.append(("API answers while cut from the broker", dict(sorted(Counter(codes).items()))))
        outcome.problems += [f"the API answered {code}" for code in codes if code >= 500 and code != 503]
    settled_during = len(final) - settled_before
    held_for = HOLD_S + max(0.0, time.monotonic() - hold_ends)
    fault.heal(fleet, target)
    healed_at = time.time()
    settled_at_heal = len(final)
    first_after_heal: float | None = None
    deadline = time.monotonic() + 300
    while pending and time.monotonic() < deadline:
        poll()
        if first_after_heal is None and len(final) > settled_at_heal:
            first_after_heal = time.time() - healed_at
        time.sleep(0.2)
    fleet.threads.store.engine.dispose()

    if pending:
        outcome.problems.append(f"{len(pending)} runs never settled:\n" + describe_stuck(fleet, pending))
    report = check_runs(fleet, started, final)
    outcome.problems += report["problems"]
    outcome.problems += _half_written(fleet)

    fenced, skipped = _late_writes(fleet, held, fault_at)
    redispatch: list[float] = []
    for worker in fleet.workers():
        for stamp, owner in REDISPATCHED_AT.findall(worker.log_text()):
            at = _log_time(stamp)
            if owner in owners and at >= fault_at:
                redispatch.append(at - fault_at)
    if fault.late_writes and held and fenced + skipped == 0:
        outcome.problems.append(f"{len(held)} runs were held at the fault, yet no late write met the fence")

    first = f"{min(redispatch):.1f} s" if redispatch else "none"
    done, parked = report["statuses"]["completed"], report["statuses"]["parked"]
    after_heal = f"{first_after_heal:.1f} s" if first_after_heal is not None else "none (all settled)"
    outcome.rows = [
        *outcome.rows,
        ("host at fault", target),
        ("runs (started at once) / peak queued", f"{runs} / {peak}"),
        ("completed / parked / other", f"{done} / {parked} / {len(final) - done - parked}"),
        ("runs the host held at the fault", len(held)),
        ("fault held", f"{held_for:.0f} s"),
        ("runs settled during the fault", settled_during),
        ("late writes refused: fence lost / stale task skipped", f"{fenced} / {skipped}"),
        ("first re-dispatch of a held run after the fault", first),
        ("first run settled after the heal", after_heal),
        ("bound: a lease plus two ticks", f"{BOUND_S:g} s"),
        ("reruns (effect > 1) by class", dict(report["reruns"]) or "none"),
        ("duplicate unguarded effects (must be 0)", report["unguarded_duplicates"]),
        ("problems (must be 0)", len(outcome.problems)),
    ]
    return outcome


def report_table(outcome: Outcome) -> str:
    width = max(len(name) for name, _ in outcome.rows)
    lines = ["", f"fault: {outcome.fault.name}", "-" * (width + 24)]
    lines += [f"{name:<{width}}  {value!s}" for name, value in outcome.rows]
    lines += [f"problem: {p}" for p in outcome.problems[:10]]
    return "\n".join(lines)
