"""The soak's invariants, shared by every soak (tests/chaos/test_soak.py, tests/chaos/test_rabbitmq_restart.py,
tests/fleet/): each run's status as the store has it, and the check that no run was lost, no effect
that must not repeat happened twice, no call has two results and every interrupted call settled
as its effect class allows.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from tests.chaos import chaos_agents

if TYPE_CHECKING:
    from tests.chaos.conftest import ChaosCluster

# Effect classes whose interrupted calls may park (the others always have a way to settle).
MAY_PARK = {"unguarded", "idempotent_tiny", "reconcilable_nonfinal"}
AT_MOST_ONCE = {"unguarded", "idempotent_tiny", "reconcilable", "reconcilable_nonfinal"}
SETTLED = {
    "completed",
    "error",
    "aborted",
    "interrupted",
    "parked",
    "awaiting_approval",
    "awaiting_variable",
}

#: A worker's log line saying the backbone re-dispatched a run whose lease (of ``host:pid``) expired,
#: with the line's local time.
REDISPATCHED_AT = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): WARNING/[^\]]+\] run run_\w+: lease of (\S+) expired",
    re.M,
)


def describe_stuck(cluster: ChaosCluster, run_ids: set[str], limit: int = 10) -> str:
    """What the store says about runs that never settled: the run, its calls, its outbox rows."""
    lines = []
    with cluster.threads.store.engine.connect() as conn:
        for run_id in sorted(run_ids)[:limit]:
            run = conn.execute(
                text("select status, step, fence, lease_owner, lease_expires_at from runs where id = :id"),
                {"id": run_id},
            ).one()
            calls = conn.execute(
                text("select effect_key, tool, status, attempt, lease_expires_at from tool_calls where run_id = :id"),
                {"id": run_id},
            ).all()
            outbox = conn.execute(
                text("select key, due_at, publish_count from outbox where key like :pattern"),
                {"pattern": f"%{run_id}%"},
            ).all()
            lines.append(
                f"{run_id}: {tuple(run)}\n  calls: {[tuple(c) for c in calls]}\n  outbox: {[tuple(o) for o in outbox]}"
            )
    return "\n".join(lines)


def statuses(cluster: ChaosCluster, run_ids: set[str]) -> dict[str, str]:
    """Each run's status; nothing while PostgreSQL is restarting (the next poll asks again)."""
    from sqlalchemy.exc import DBAPIError

    if not run_ids:
        return {}
    try:
        with cluster.threads.store.engine.connect() as conn:
            rows = conn.execute(text("select id, status from runs where id = any(:ids)"), {"ids": list(run_ids)})
            return {row.id: row.status for row in rows}
    except DBAPIError:
        return {}


def check_runs(cluster: ChaosCluster, started: dict[str, tuple[str, str]], final: dict[str, str]) -> dict[str, Any]:
    problems: list[str] = []
    engine = cluster.threads.store.engine
    with engine.connect() as conn:
        calls = (
            conn.execute(
                text(
                    "select effect_key, run_id, call_id, tool, status, attempt, result, park_reason, first_started_at "
                    "from tool_calls"
                )
            )
            .mappings()
            .all()
        )
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
        _kind, ref = started[call["run_id"]]
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
            problems.append(f"call {key} is {status} in a completed run: {result!r} {call.get('attempt')}")
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
        "unguarded_duplicates": sum(
            1 for c in calls if c["tool"] == "send_email" and len(effects[c["effect_key"]]) > 1
        ),
        "problems": problems,
    }
