"""Chaos soak: many runs with mixed effects while a killer keeps SIGKILLing workers.

``CHAOS_SOAK_RUNS`` runs (default 200, what CI runs) of every effect class, their tools sleeping
50-300 ms, are fed to two prefork workers (at most ``IN_FLIGHT`` at a time, like steady traffic)
while a killer thread strikes every 1-3 s: twice it SIGKILLs the pool process that most recently
started a tool call, then it SIGKILLs a whole worker (and starts a fresh one), and so on. A real ``celery beat`` drives the reconcile backbone.
At the end every run must be completed, or parked with a reason by an effect class that may park;
no effect that must not repeat ran twice; idempotent repeats carried the call's own key inside its
window; reconcilable calls interrupted after their effect were settled by the lookup; and no call
has two results. ``CHAOS_SOAK_SEED`` replays a killer's choices.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from tests.chaos import chaos_agents

if TYPE_CHECKING:  # the conftest is pytest's to import; tests only name its types
    from tests.chaos.conftest import ChaosCluster, WorkerProcess

RUNS = int(os.environ.get("CHAOS_SOAK_RUNS", "200"))
DEADLINE_S = float(os.environ.get("CHAOS_SOAK_DEADLINE_S", "150"))
SEED = int(os.environ.get("CHAOS_SOAK_SEED", str(random.randrange(1 << 30))))
IN_FLIGHT = 12
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
# Effect classes whose interrupted calls may park (the others always have a way to settle).
MAY_PARK = {"unguarded", "idempotent_tiny", "reconcilable_nonfinal"}
AT_MOST_ONCE = {"unguarded", "idempotent_tiny", "reconcilable", "reconcilable_nonfinal"}
SETTLED = {"completed", "error", "aborted", "interrupted", "parked", "awaiting_approval", "awaiting_variable"}


@dataclass
class Killer:
    """Every 1-3 s a strike: two SIGKILLs of a pool process, then one of a whole worker, in turn.

    A pool-process strike prefers the process that most recently started a tool call (so the kill
    lands mid-call); a whole-worker strike picks a worker at random, and only while both workers
    are up (otherwise it strikes a pool process). Dead workers are replaced at once. Pool processes of a worker are only struck once it has been ready for a second:
    Celery gives up on a worker whose pool dies while it is still starting, which tests Celery,
    not the runtime (the replacement logic would cover it anyway).
    """

    cluster: ChaosCluster
    workers: list[WorkerProcess]
    rng: random.Random
    child_kills: int = 0
    whole_kills: int = 0
    replaced: int = 0
    errors: list[str] = field(default_factory=list)
    _strikes: int = 0
    _ready_at: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        next_strike = time.monotonic() + self.rng.uniform(1.0, 3.0)
        while not self._stop.wait(0.2):
            try:
                self._replace_dead()
                if time.monotonic() >= next_strike:
                    next_strike = time.monotonic() + self.rng.uniform(1.0, 3.0)
                    self._strike()
            except Exception as exc:  # noqa: BLE001 - a miss (a process that just died) is fine
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _replace_dead(self) -> None:
        for slot, worker in enumerate(self.workers):
            if not worker.alive():
                self.workers[slot] = self.cluster.start_worker(wait=False)
                self.replaced += 1
            elif id(worker) not in self._ready_at and f"{worker.name}@" in worker.log_text() and " ready." in worker.log_text():
                self._ready_at[id(worker)] = time.monotonic()

    def _settled(self, worker: WorkerProcess) -> bool:
        ready = self._ready_at.get(id(worker))
        return worker.alive() and ready is not None and time.monotonic() - ready >= 1.0

    def _strike(self) -> None:
        self._strikes += 1
        # A whole worker only while every worker is up: one always keeps serving (and running
        # Beat's ticks) while the other restarts, which is the failure being tested.
        whole = self._strikes % 3 == 0 and all(self._settled(w) for w in self.workers)
        if not whole:
            busy = self._busy_child()
            if busy is not None:
                worker, pid = busy
                worker.kill_child(pid)
                self.child_kills += 1
            return
        slot = self.rng.randrange(len(self.workers))
        self.workers[slot].kill()
        self.whole_kills += 1
        self.workers[slot] = self.cluster.start_worker(wait=False)

    def _busy_child(self) -> tuple[WorkerProcess, int] | None:
        children = {pid: w for w in self.workers if self._settled(w) for pid in w.child_pids()}
        for entry in reversed(self.cluster.ledger.entries()[-20:]):
            if entry.kind == "start" and entry.pid in children:
                return children[entry.pid], entry.pid
        if not children:
            return None
        pid = self.rng.choice(sorted(children))
        return children[pid], pid

    def stop(self) -> None:
        self._stop.set()


def test_soak_mixed_effects_under_random_kills(cluster: ChaosCluster) -> None:
    rng = random.Random(SEED)
    print(f"\nchaos soak: {RUNS} runs, seed {SEED} (CHAOS_SOAK_SEED={SEED} replays the killer's choices)")
    workers = cluster.start_workers(2)
    cluster.start_beat()
    agents = {**chaos_agents.AGENTS, "mixed": chaos_agents.mixed_agent}
    plan = rng.choices(list(MIX), weights=list(MIX.values()), k=RUNS)

    killer = Killer(cluster, workers, random.Random(SEED + 1))
    killer_thread = threading.Thread(target=killer.run, name="chaos-killer", daemon=True)
    started: dict[str, tuple[str, str]] = {}  # run id -> (agent kind, ref)
    pending: set[str] = set()
    final: dict[str, str] = {}
    began = time.monotonic()
    queue = list(plan)
    killer_thread.start()
    try:
        while queue or pending:
            if time.monotonic() - began >= DEADLINE_S:
                break
            while queue and len(pending) < IN_FLIGHT:
                kind = queue.pop()
                ref = uuid.uuid4().hex[:12]
                seconds = round(rng.uniform(0.05, 0.3), 3)
                sleep_first = kind.startswith("reconcilable") and rng.random() < 0.5
                handle = cluster.threads.start(
                    agents[kind],
                    chaos_agents.message(ref, seconds=seconds, repeat_seconds=seconds, sleep_first=sleep_first),
                )
                started[handle.run_id] = (kind, ref)
                pending.add(handle.run_id)
            for run_id, status in _statuses(cluster, pending).items():
                if status in SETTLED:
                    final[run_id] = status
                    pending.discard(run_id)
            time.sleep(0.1)
    finally:
        killer.stop()
        killer_thread.join(timeout=10)
    elapsed = time.monotonic() - began

    report = _check(cluster, started, final)
    print(_table(report, killer, elapsed))
    assert not pending and not queue, (
        f"{len(pending)} runs unsettled and {len(queue)} never started after {DEADLINE_S:g} s:\n"
        + _describe_stuck(cluster, pending)
    )
    assert not report["problems"], "\n".join(report["problems"][:40])


def _describe_stuck(cluster: ChaosCluster, run_ids: set[str], limit: int = 10) -> str:
    """What the store says about runs that never settled: the run, its calls, its outbox rows."""
    lines = []
    with cluster.threads.store.engine.connect() as conn:
        for run_id in sorted(run_ids)[:limit]:
            run = conn.execute(
                text("select status, step, fence, lease_owner, lease_expires_at from runs where id = :id"), {"id": run_id}
            ).one()
            calls = conn.execute(
                text("select effect_key, tool, status, attempt, lease_expires_at from tool_calls where run_id = :id"),
                {"id": run_id},
            ).all()
            outbox = conn.execute(
                text("select key, due_at, publish_count from outbox where key like :pattern"), {"pattern": f"%{run_id}%"}
            ).all()
            lines.append(f"{run_id}: {tuple(run)}\n  calls: {[tuple(c) for c in calls]}\n  outbox: {[tuple(o) for o in outbox]}")
    return "\n".join(lines)


def _statuses(cluster: ChaosCluster, run_ids: set[str]) -> dict[str, str]:
    if not run_ids:
        return {}
    with cluster.threads.store.engine.connect() as conn:
        rows = conn.execute(text("select id, status from runs where id = any(:ids)"), {"ids": list(run_ids)})
        return {row.id: row.status for row in rows}


def _check(cluster: ChaosCluster, started: dict[str, tuple[str, str]], final: dict[str, str]) -> dict[str, Any]:
    problems: list[str] = []
    engine = cluster.threads.store.engine
    with engine.connect() as conn:
        calls = conn.execute(
            text(
                "select effect_key, run_id, call_id, tool, status, attempt, result, park_reason, first_started_at "
                "from tool_calls"
            )
        ).mappings().all()
        duplicates = conn.execute(
            text(
                "select thread_id, parts->'tool_result'->>'call_id' as call_id, count(*) as n from messages "
                "where role = 'tool' group by 1, 2 having count(*) > 1"
            )
        ).all()
        runs = {r.id: r for r in conn.execute(text("select id, status, error from runs")).all()}

    ledger = cluster.ledger.entries()
    effects: dict[str, list[Any]] = defaultdict(list)
    starts: dict[str, list[Any]] = defaultdict(list)
    by_ref: dict[tuple[str, str], set[str]] = defaultdict(set)
    for entry in ledger:
        if entry.kind == "effect":
            effects[entry.effect_key].append(entry)
            by_ref[(entry.tool, entry.ref)].add(entry.effect_key)
        else:
            starts[entry.effect_key].append(entry)

    statuses = Counter(final.values())
    for run_id, status in final.items():
        if status not in ("completed", "parked"):
            problems.append(f"run {run_id} ended {status}: {runs[run_id].error}")
    for thread_id, call_id, n in duplicates:
        problems.append(f"call {call_id} in {thread_id} has {n} tool results")

    reruns: Counter[str] = Counter()
    parks: Counter[str] = Counter()
    found: Counter[str] = Counter()
    keys_of_run: dict[str, list[str]] = defaultdict(list)
    for call in calls:
        key, cls = call["effect_key"], chaos_agents.EFFECT_CLASS_OF_TOOL[call["tool"]]
        keys_of_run[call["run_id"]].append(key)
        kind, ref = started[call["run_id"]]
        n = len(effects[key])
        if n > 1:
            reruns[cls] += 1
        if cls in AT_MOST_ONCE and n > 1:
            problems.append(f"{cls} call {key} had its effect {n} times")
        if cls in AT_MOST_ONCE and n and any(st.at > effects[key][0].at for st in starts[key]):
            problems.append(f"{cls} call {key} was executed again after its effect happened")
        if by_ref[(call["tool"], ref)] - {key}:
            problems.append(f"{call['tool']} for ref {ref} ran under another key: {by_ref[(call['tool'], ref)]}")
        if cls == "idempotent" and n > 1:
            window_s = chaos_agents.TOOLS[cls].dedup_window_ms / 1000
            first = call["first_started_at"].timestamp()
            late = [e for e in effects[key] if e.at - first >= window_s]
            if late:
                problems.append(f"idempotent call {key} repeated outside its {window_s:g} s window: {late}")
        status, result = call["status"], call["result"] or ""
        if status == "parked":
            parks[cls] += 1
            if cls not in MAY_PARK:
                problems.append(f"{cls} call {key} parked: {call['park_reason']}")
            if not call["park_reason"]:
                problems.append(f"call {key} parked without a reason")
            if cls == "reconcilable_nonfinal" and n:
                problems.append(f"nonfinal call {key} parked although its lookup could find its effect")
        elif status == "completed":
            if result.startswith("found:"):
                found[cls] += 1
                if n != 1 or result != f"found:{key}":
                    problems.append(f"call {key} recorded {result!r} by lookup with {n} effects")
            elif result.startswith("done:"):
                if n < 1:
                    problems.append(f"call {key} completed as {result!r} but its effect never happened")
            else:
                problems.append(f"call {key} completed with an unexpected result {result!r}")
        elif final.get(call["run_id"]) == "completed":
            problems.append(f"call {key} is {status} in a completed run")
    for run_id, status in final.items():
        if status == "completed" and not keys_of_run[run_id]:
            problems.append(f"run {run_id} completed without calling its tool")

    return {
        "runs": len(final),
        "statuses": statuses,
        "reruns": reruns,
        "parks": parks,
        "found": found,
        "calls": len(calls),
        "effects": sum(len(v) for v in effects.values()),
        "unguarded_duplicates": sum(1 for c in calls if c["tool"] == "send_email" and len(effects[c["effect_key"]]) > 1),
        "problems": problems,
    }


def _table(report: dict[str, Any], killer: Killer, elapsed: float) -> str:
    classes = list(chaos_agents.TOOLS)
    rows = [
        ("runs", report["runs"]),
        ("completed", report["statuses"]["completed"]),
        ("parked (with a reason)", report["statuses"]["parked"]),
        ("other statuses", sum(n for s, n in report["statuses"].items() if s not in ("completed", "parked"))),
        ("tool calls / effects in the ledger", f"{report['calls']} / {report['effects']}"),
        ("kills: pool process / whole worker", f"{killer.child_kills} / {killer.whole_kills}"),
        ("workers that died otherwise, replaced", killer.replaced),
        *[(f"reruns (effect > 1): {c}", report["reruns"][c]) for c in classes],
        *[(f"parks: {c}", report["parks"][c]) for c in classes],
        *[(f"settled by lookup: {c}", report["found"][c]) for c in ("reconcilable", "reconcilable_nonfinal")],
        ("duplicate unguarded effects (must be 0)", report["unguarded_duplicates"]),
        ("elapsed", f"{elapsed:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = ["", "chaos soak summary", "-" * (width + 12)]
    lines += [f"{name:<{width}}  {value:>8}" for name, value in rows]
    if killer.errors:
        lines.append(f"killer misses: {len(killer.errors)} (e.g. {killer.errors[0]})")
    return "\n".join(lines)
