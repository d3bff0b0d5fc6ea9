"""Durable tool-call overhead: N durable no-op tool calls against N bare Celery tasks.

Both sides run on the same Redis broker and in the same real worker (``celery -A tasks worker``,
prefork, concurrency 2, the project's Celery settings): the durable side is one model reply
calling a no-op tool N times (the calls of one reply run in sequence, one task each); the bare
side is a chain of N Celery tasks doing the same no-op, each enqueueing the next. The worker
records, per task, its start and end time and the SQL it ran (``bench/bench_agents.py``), so
per-call time is measured between task ends inside the worker, the same way on both sides:

* durable: (end of the last tool task - end of the model step that asked for the calls) / N
* bare:    (end of the last chain task - end of the chain's first task) / N

Also printed: the whole run from ``Threads.start()`` to completion (two model steps plus the N
calls), SQL statements, commits and round trips per tool call as the worker counted them, and one
call of each effect traced statement by statement in-process against the same database.

Run by hand, never by CI (PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379)::

    .venv/bin/python bench/tool_call_overhead.py --n 200 --repeat 3

It creates a fresh database (dropped at the end) and uses Redis DB 13, which it flushes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    add_service_options,
    flushed_redis,
    fresh_database,
    load_average,
    read_traces,
    wait_done,
    worker,
    worker_env,
)

TARGET_RATIO = 2.0
TARGET_COMMITS = 2
TARGET_STATEMENTS = 10


@dataclass
class Sample:
    per_call_ms: float
    total_ms: float
    executions: int
    in_task_ms: float = 0.0
    cpu_ms: float = 0.0
    statements: float = 0.0
    commits: float = 0.0
    rollbacks: float = 0.0
    begins: float = 0.0
    pings: float = 0.0
    model_steps_ms: float = 0.0

    @property
    def round_trips(self) -> float:
        return self.statements + self.commits + self.rollbacks + self.begins + self.pings


def run_bare(app: Any, redis_client: Any, trace_dir: str, n: int, timeout: float, *, stored: bool = False) -> Sample:
    from bench.bench_agents import CHAIN_TASK, STORED_CHAIN_TASK

    key = f"chain_{uuid.uuid4().hex}"
    started = time.time()
    app.send_task(
        STORED_CHAIN_TASK if stored else CHAIN_TASK, args=[n, key], task_id=f"{key}:{n}", argsrepr=f"{key}:{n}"
    )
    done = wait_done(redis_client, key, timeout)
    finished = time.time()
    records = read_traces(trace_dir, key)
    first = next(r for r in records if r["id"] == f"{key}:{n}")
    rest = [r for r in records if r is not first]
    return Sample(
        per_call_ms=(done["t"] - first["t1"]) * 1000 / n,
        total_ms=(finished - started) * 1000,
        executions=len(rest),
        in_task_ms=sum(r["t1"] - r["t0"] for r in rest) * 1000 / n,
        cpu_ms=sum(r["cpu"] for r in rest) * 1000 / n,
    )


def run_durable(threads: Any, redis_client: Any, trace_dir: str, tool_name: str, n: int, timeout: float) -> Sample:
    started = time.time()
    handle = threads.start("bench_noop", f"{tool_name} {n}")
    done = wait_done(redis_client, handle.run_id, timeout)
    finished = time.time()
    run = threads.get_run(handle.run_id)
    if run.status != "completed":
        raise RuntimeError(f"run {run.id} ended {run.status}: {run.error} ({done})")
    records = read_traces(trace_dir, handle.run_id)
    steps = [r for r in records if r["task"] == "threads.step"]
    tools = [r for r in records if r["task"] == "threads.tool"]
    asked = next(r for r in steps if r["retval"].startswith("called"))
    count = len(tools)
    return Sample(
        per_call_ms=(max(r["t1"] for r in tools) - asked["t1"]) * 1000 / n,
        total_ms=(finished - started) * 1000,
        executions=count,
        in_task_ms=sum(r["t1"] - r["t0"] for r in tools) * 1000 / n,
        cpu_ms=sum(r["cpu"] for r in tools) * 1000 / n,
        statements=sum(r["statements"] for r in tools) / n,
        commits=sum(r["commits"] for r in tools) / n,
        rollbacks=sum(r["rollbacks"] for r in tools) / n,
        begins=sum(r["begins"] for r in tools) / n,
        pings=sum(r["pings"] for r in tools) / n,
        model_steps_ms=sum((r["t1"] - r["t0"]) * 1000 for r in steps),
    )


# -- one call, statement by statement (in-process, same database) ------------------------------


def explain_one_call(database_url: str) -> dict[str, list[str]]:
    """Run one call of each effect through ``Runtime.run_tool`` here, logging every round trip."""
    from bench import bench_agents
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.runtime.machine import Runtime
    from threads_celery.transitions import runs
    from threads_celery.transitions.publishing import open_store

    bench_agents.install_sql_counters()
    store = open_store(database_url)
    registry = AgentRegistry()
    registry.add(bench_agents.bench_noop)
    published: list[Any] = []
    runtime = Runtime(store, registry, publish=published.extend, worker_id="bench-explain")
    agent = bench_agents.bench_noop
    logs: dict[str, list[str]] = {}
    try:
        for tool_name in ("noop_ro", "noop_ug"):
            with store.transaction() as tx:
                tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), runs.utcnow())
                run, _ = runs.submit_run(
                    tx, agent=agent.name, config_hash=agent.config_hash(), message=f"{tool_name} 3", now=runs.utcnow()
                )
            published.clear()
            runtime.run_step(run.id, 0)
            first = published[0].key
            runtime.run_tool(first)  # warm: the first call of a process pays for imports
            second = published[-1].key
            bench_agents.counters.reset()
            bench_agents.counters.log = []
            outcome = runtime.run_tool(second)
            logs[tool_name] = [*bench_agents.counters.log, f"-> {outcome}"]
            bench_agents.counters.log = None
    finally:
        store.dispose()
    return logs


# -- report -------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


ROWS = (
    ("bare", "bare Celery chain"),
    ("bare_stored", "bare, results stored"),
    ("noop_ro", "durable, read_only"),
    ("noop_ug", "durable, unguarded"),
)


def report(results: dict[str, list[Sample]], explained: dict[str, list[str]], n: int, repeat: int) -> None:
    def m(kind: str, field: str) -> float:
        return median([getattr(s, field) for s in results[kind]])

    bare, stored = m("bare", "per_call_ms"), m("bare_stored", "per_call_ms")
    print()
    print(f"per call, median of {repeat} runs of {n}:")
    print(
        f"{'':<24}{'ms':>8}{'ratio':>7}{'vs stored':>10}{'in task':>9}{'cpu':>7}"
        f"{'stmts':>7}{'commits':>8}{'round trips':>12}{'runs':>6}"
    )
    for kind, label in ROWS:
        per_call = m(kind, "per_call_ms")
        sql = kind.startswith("noop")
        print(
            f"{label:<24}{per_call:>8.2f}{per_call / bare:>7.2f}{per_call / stored:>10.2f}"
            f"{m(kind, 'in_task_ms'):>9.2f}{m(kind, 'cpu_ms'):>7.2f}"
            + (
                f"{m(kind, 'statements'):>7.1f}{m(kind, 'commits'):>8.1f}{m(kind, 'round_trips'):>12.1f}"
                if sql
                else f"{'':>7}{'':>8}{'':>12}"
            )
            + f"{m(kind, 'executions'):>6.0f}"
        )
    print()
    print("whole run, start() to completion (median):")
    print(f"  bare chain of {n + 1} tasks:                   {m('bare', 'total_ms'):9.1f} ms")
    print(f"  the same, results stored:                {m('bare_stored', 'total_ms'):9.1f} ms")
    for kind in ("noop_ro", "noop_ug"):
        print(
            f"  durable {kind}, 2 model steps + {n} calls: {m(kind, 'total_ms'):9.1f} ms"
            f" (the model steps: {m(kind, 'model_steps_ms'):.1f} ms)"
        )
    print()
    print("  ms: between task ends inside the worker. ratio: over the bare chain as the project")
    print("  configures Celery (results ignored, as by the durable tasks); vs stored: over a bare")
    print("  chain storing its results in Redis, the baseline of DESIGN.md section 11 (4.3 ms).")
    print("  in task: task start to end (the rest of ms is the hop: broker, worker, pool process);")
    print("  cpu: CPU time of the pool process in the task. round trips: to PostgreSQL, counting")
    print("  BEGIN, COMMIT, ROLLBACK and pool pre-pings. runs: task executions per run (N unless a")
    print("  task was retried or delivered twice).")
    for tool_name, lines in explained.items():
        print(f"\none {tool_name} call, in-process, every round trip:")
        for line in lines:
            print(f"  {line[:150]}")
    print()
    ratio = max(m("noop_ro", "per_call_ms"), m("noop_ug", "per_call_ms")) / bare
    commits = max(m("noop_ro", "commits"), m("noop_ug", "commits"))
    statements = max(m("noop_ro", "statements"), m("noop_ug", "statements"))
    print(
        f"targets: ratio {ratio:.2f} <= {TARGET_RATIO} {'ok' if ratio <= TARGET_RATIO else 'MISSED'}; "
        f"commits {commits:.1f} <= {TARGET_COMMITS} {'ok' if commits <= TARGET_COMMITS else 'MISSED'}; "
        f"statements {statements:.1f} <= {TARGET_STATEMENTS} {'ok' if statements <= TARGET_STATEMENTS else 'MISSED'}"
    )


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="tool calls (and bare tasks) per run (default 200)")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs of each kind (default 3)")
    parser.add_argument("--warmup", type=int, default=20, help="calls per warm-up run (default 20)")
    parser.add_argument("--concurrency", type=int, default=2, help="worker prefork processes (default 2)")
    add_service_options(parser, redis_db=13)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one run")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    parser.add_argument("--no-explain", action="store_true", help="skip the statement-by-statement trace")
    parser.add_argument("--json", metavar="PATH", help="also write the samples as JSON")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile (CPU time) each pool process inside the tasks of --profile-kind only, run --repeat"
        " times after the warm-up, and leave the stats in DIR (python -m pstats); no figures are printed",
    )
    parser.add_argument("--profile-kind", choices=("bare", "noop_ro", "noop_ug"), default="noop_ro")
    parser.add_argument(
        "--loglevel", default="warning", help="the worker's log level (info: a line per task, as a default worker logs)"
    )
    args = parser.parse_args(argv)

    redis_client = flushed_redis(args.redis_url)
    print(
        f"tool-call overhead: n={args.n} repeat={args.repeat} concurrency={args.concurrency} "
        f"cpus={os.cpu_count()} python={platform.python_version()} "
        f"date={time.strftime('%Y-%m-%d %H:%M:%S %z')} "
        f"load={load_average()}"
    )

    results: dict[str, list[Sample]] = {"bare": [], "bare_stored": [], "noop_ro": [], "noop_ug": []}
    explained: dict[str, list[str]] = {}
    with (
        fresh_database(args.pg_host, args.pg_port, args.pg_user, args.keep_db) as database_url,
        tempfile.TemporaryDirectory(prefix="tc-bench-") as trace_dir,
    ):
        env = worker_env(database_url, args.redis_url, trace_dir)
        if args.profile:
            from bench.bench_agents import CHAIN_TASK
            from threads_celery.transitions.runs import TOOL_TASK

            env["BENCH_PROFILE"] = "cpu"
            env["BENCH_PROFILE_TASKS"] = CHAIN_TASK if args.profile_kind == "bare" else TOOL_TASK
        from threads_celery import Threads

        log_path = Path(trace_dir) / "worker.log"
        threads = Threads(database_url=database_url, broker_url=args.redis_url)
        try:
            with worker(env, args.concurrency, log_path, args.loglevel) as process:
                # Warm up both sides (imports, connections in both pool processes); the first
                # run also waits for the worker to come up.
                for _ in range(2):
                    run_bare(threads.app, redis_client, trace_dir, args.warmup, 60.0)
                    run_bare(threads.app, redis_client, trace_dir, args.warmup, 60.0, stored=True)
                    for tool_name in ("noop_ro", "noop_ug"):
                        run_durable(threads, redis_client, trace_dir, tool_name, args.warmup, 60.0)
                for _ in range(args.repeat if args.profile else 0):
                    if args.profile_kind == "bare":
                        run_bare(threads.app, redis_client, trace_dir, args.n, args.timeout)
                    else:
                        run_durable(threads, redis_client, trace_dir, args.profile_kind, args.n, args.timeout)
                for i in range(0 if args.profile else args.repeat):
                    results["bare"].append(run_bare(threads.app, redis_client, trace_dir, args.n, args.timeout))
                    results["bare_stored"].append(
                        run_bare(threads.app, redis_client, trace_dir, args.n, args.timeout, stored=True)
                    )
                    for tool_name in ("noop_ro", "noop_ug"):
                        results[tool_name].append(
                            run_durable(threads, redis_client, trace_dir, tool_name, args.n, args.timeout)
                        )
                    print(
                        f"  repeat {i + 1}: bare {results['bare'][-1].per_call_ms:.2f} ms, "
                        f"bare stored {results['bare_stored'][-1].per_call_ms:.2f} ms, "
                        f"read_only {results['noop_ro'][-1].per_call_ms:.2f} ms, "
                        f"unguarded {results['noop_ug'][-1].per_call_ms:.2f} ms per call"
                    )
                if not process.alive():
                    print(log_path.read_text(), file=sys.stderr)
                    raise RuntimeError("the worker exited during the benchmark")
        except Exception:
            if log_path.exists():
                print("--- worker log ---", file=sys.stderr)
                print(log_path.read_text()[-5000:], file=sys.stderr)
            raise
        finally:
            threads.close()
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            for prof in Path(trace_dir).glob("*.prof"):
                shutil.copy(prof, args.profile)
            print(f"profiles of {args.profile_kind} in {args.profile} (python -m pstats)")
            return 0
        if not args.no_explain:
            explained = explain_one_call(database_url)
    redis_client.flushdb()

    report(results, explained, args.n, args.repeat)
    print(f"load average at the end: {load_average()}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({k: [vars(s) for s in v] for k, v in results.items()} | {"explain": explained}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
