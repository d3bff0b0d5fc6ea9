"""Per-turn overhead against history length: one run of many turns, early turns against late ones.

One durable run of ``--turns`` turns (each a model step calling a no-op ``read_only`` tool, on the
constant-cost model ``bench_turns`` of ``bench/bench_agents.py``) in a real prefork worker on
Redis. The worker records each task's start, end and the CPU time of its pool process; a turn is
a model step plus its tool call. Printed: per turn, the median wall time (between the ends of
consecutive model steps) and the median CPU time (step plus call, in the pool process) over a
window of turns near the start (turns 11-30 by default: after warm-up, about 10 turns of
history) and near the end (the last 20 turns), and the ratios late / early.

The step's CPU is split in two: the model layer's (``pydantic_ai.direct``'s request and the
model's, timed in the worker around the call: see ``time_model_layer`` in
``bench/bench_agents.py``), which reads the whole history on every request as any model does,
and the runtime's, the rest. The target (issue 14: the per-turn overhead, model excluded, at
most 1.3x higher at 1,000 turns than at 10) is on the turn's CPU without the model layer; the
whole turn's ratio is printed beside it.

A model turn plus its tool call is also what DESIGN.md section 11 compares with two DBOS steps.

Run by hand, never by CI::

    .venv/bin/python bench/history_length.py --turns 1000

It creates a fresh database (dropped at the end) and uses Redis DB 11, which it flushes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    when_registered,
    worker,
    worker_env,
)

TARGET_RATIO = 1.3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000, help="turns of the run (default 1000)")
    parser.add_argument("--window", type=int, default=20, help="turns per window (default 20)")
    parser.add_argument("--early", type=int, default=10, help="turns before the early window (default 10)")
    parser.add_argument("--concurrency", type=int, default=2, help="worker prefork processes (default 2)")
    add_service_options(parser, redis_db=11)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    if args.turns < args.early + 2 * args.window:
        parser.error("--turns must be at least --early + 2 x --window")

    redis_client = flushed_redis(args.redis_url)
    print(
        f"history length: turns={args.turns} window={args.window} concurrency={args.concurrency} "
        f"date={time.strftime('%Y-%m-%d %H:%M:%S %z')} load={load_average()}"
    )
    with (
        fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as database_url,
        tempfile.TemporaryDirectory(prefix="tc-bench-") as trace_dir,
    ):
        env = worker_env(database_url, args.redis_url, trace_dir)
        from threads_celery import Threads

        threads = Threads(database_url=database_url, broker_url=args.redis_url)
        log_path = Path(trace_dir) / "worker.log"
        try:
            with worker(env, args.concurrency, log_path):
                handle = when_registered(lambda: threads.start("bench_turns", f"turns {args.turns}"))
                wait_done(redis_client, handle.run_id, args.timeout)
                run = threads.get_run(handle.run_id)
                if run.status != "completed":
                    raise RuntimeError(f"run ended {run.status}: {run.error}")
        except Exception:
            if log_path.exists():
                print(log_path.read_text()[-5000:], file=sys.stderr)
            raise
        finally:
            threads.close()
        records = read_traces(trace_dir, handle.run_id)
        if os.environ.get("BENCH_DUMP"):
            for r in records[:12]:
                print(
                    r["task"],
                    f"{(r['t1'] - r['t0']) * 1000:.1f} ms in task, cpu {r['cpu'] * 1000:.1f}",
                    r["retval"][:40],
                )
    redis_client.flushdb()

    steps = [r for r in records if r["task"] == "threads.step" and r["retval"].startswith(("called", "completed"))]
    tools = [r for r in records if r["task"] == "threads.tool"]
    # Turn i: step i (asks for call i) and the call; wall = end of step i+1 - end of step i.
    turns = []
    for i in range(len(tools)):
        wall = (steps[i + 1]["t1"] - steps[i]["t1"]) * 1000
        cpu = (steps[i]["cpu"] + tools[i]["cpu"]) * 1000
        step_cpu = steps[i]["cpu"] * 1000
        model_cpu = steps[i].get("model_cpu", 0.0) * 1000
        turns.append((wall, cpu, step_cpu, tools[i]["cpu"] * 1000, model_cpu, cpu - model_cpu))

    def window(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
        return tuple(statistics.median(r[k] for r in rows) for k in range(len(rows[0])))

    early = window(turns[args.early : args.early + args.window])
    late = window(turns[-args.window :])
    print(f"\nper turn (a model step and its tool call), median over {args.window} turns:")
    print(f"{'':<24}{'wall ms':>9}{'cpu ms':>9}{'step cpu':>10}{'call cpu':>10}{'model layer':>13}{'runtime':>9}")
    for label, row in (
        (f"turns {args.early + 1}-{args.early + args.window}", early),
        (f"turns {len(turns) - args.window + 1}-{len(turns)}", late),
    ):
        print(f"{label:<24}{row[0]:>9.2f}{row[1]:>9.2f}{row[2]:>10.2f}{row[3]:>10.2f}{row[4]:>13.2f}{row[5]:>9.2f}")
    ratio_cpu, ratio_wall, ratio_runtime = late[1] / early[1], late[0] / early[0], late[5] / early[5]
    print("  model layer: CPU inside pydantic_ai.direct's request (its preparation, the model, the stream);")
    print("  runtime: the turn's CPU without it (the step's and the call's)")
    print(
        f"late / early: wall {ratio_wall:.2f}, cpu {ratio_cpu:.2f}, model layer {late[4] / max(early[4], 1e-9):.2f}, "
        f"runtime {ratio_runtime:.2f}; target runtime <= {TARGET_RATIO}: "
        f"{'ok' if ratio_runtime <= TARGET_RATIO else 'MISSED'}"
    )
    for label, rows in (("model step", steps[:-1]), ("tool call", tools)):
        trips = [r["statements"] + r["commits"] + r["begins"] + r["rollbacks"] + r["pings"] for r in rows]
        print(
            f"{label}: statements {statistics.median(r['statements'] for r in rows):.0f}, "
            f"commits {statistics.median(r['commits'] for r in rows):.0f}, round trips {statistics.median(trips):.0f} (median)"
        )
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
