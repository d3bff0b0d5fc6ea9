"""Concurrent read_only calls: one model reply with N calls of M ms, against the same calls in order.

A real worker (``celery -A tasks worker``, prefork, ``--concurrency`` slots, default 8) on the
Redis broker and a fresh PostgreSQL database. Each sample is one run whose model reply makes
``--calls`` calls of a tool that sleeps ``--ms`` milliseconds; the time measured is from the
commit of the model step that asked for the calls to the commit of the last tool result (both
read from the ledger: the assistant message's and the last tool message's ``created_at``), so
neither model step's latency is in it. Three kinds of run, side by side:

* ``concurrent``: the tool is ``concurrent=True``: the calls run as parallel tasks;
* ``concurrent, 0 ms``: the same with a no-op tool: the durable overhead of the group alone;
* ``in order`` (and ``in order, 0 ms``): the same tool without ``concurrent``: the calls run
  one after another.

The target (issue 11): with 8 free slots, 8 calls of 200 ms finish in at most 1.3 x 200 ms plus
the durable overhead. Run by hand, never by CI::

    .venv/bin/python bench/parallel_calls.py --calls 8 --ms 200 --repeat 5

It creates a fresh database (dropped at the end) and flushes the Redis DB it is given
(``--redis-url``, default DB 14).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import fresh_database, worker  # noqa: E402

AGENTS_MODULE = "bench.bench_parallel_agents"
TARGET_FACTOR = 1.3


def group_ms(threads: object, thread_id: str) -> float:
    """From the step commit that asked for the calls to the commit of the last tool result."""
    messages = threads.messages(thread_id)  # type: ignore[attr-defined]
    asked = next(m for m in messages if m.role == "assistant" and m.tool_calls)
    last = [m for m in messages if m.role == "tool"][-1]
    return (last.created_at - asked.created_at).total_seconds() * 1000


def sample(threads: object, agent: object, message: str) -> float:
    handle = threads.start(agent, message)  # type: ignore[attr-defined]
    run = threads.wait(handle.run_id, 120)  # type: ignore[attr-defined]
    if run.status != "completed":
        raise SystemExit(f"run {run.id} ended {run.status}: {run.error}")
    return group_ms(threads, handle.thread_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--ms", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8, help="worker slots (prefork processes)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    args = parser.parse_args()

    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    print(
        f"machine: {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()} "
        f"date={time.strftime('%Y-%m-%d %H:%M:%S %z')} load={' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    from bench.bench_parallel_agents import bench_parallel
    from threads_celery import Threads

    with fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as database_url, \
            tempfile.TemporaryDirectory(prefix="tc-bench-parallel-") as directory:  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "THREADS_DATABASE_URL": database_url,
            "THREADS_BROKER_URL": args.redis_url,
            "THREADS_AGENTS": AGENTS_MODULE,
            "THREADS_MAX_PARALLEL_TOOL_CALLS": str(max(args.calls, 1)),
        }
        threads = Threads(database_url=database_url, broker_url=args.redis_url)
        threads.register(bench_parallel)
        try:
            with worker(env, args.concurrency, Path(directory) / "worker.log"):
                kinds = {
                    "concurrent": f"sleep_concurrent {args.calls} {args.ms}",
                    "concurrent, 0 ms": f"sleep_concurrent {args.calls} 0",
                    "in order": f"sleep_in_order {args.calls} {args.ms}",
                    "in order, 0 ms": f"sleep_in_order {args.calls} 0",
                }
                for message in kinds.values():  # warm up every pool process and connection
                    sample(threads, bench_parallel, message)
                results: dict[str, list[float]] = {kind: [] for kind in kinds}
                for _ in range(args.repeat):
                    for kind, message in kinds.items():
                        results[kind].append(sample(threads, bench_parallel, message))
        finally:
            threads.close()

    medians = {kind: statistics.median(values) for kind, values in results.items()}
    print(f"\n{args.calls} calls of {args.ms} ms, {args.concurrency} worker slots, median of {args.repeat}:")
    print("| run | group ms (median) | min | max | ratio to one call |")
    print("|---|---|---|---|---|")
    for kind, values in results.items():
        print(
            f"| {kind} | {medians[kind]:.0f} | {min(values):.0f} | {max(values):.0f} | "
            f"{medians[kind] / max(args.ms, 1):.2f} |"
        )
    overhead = medians["concurrent, 0 ms"]
    bound = TARGET_FACTOR * args.ms + overhead
    verdict = "met" if medians["concurrent"] <= bound else "NOT met"
    print(
        f"\ntarget: concurrent <= {TARGET_FACTOR} x {args.ms} ms + overhead ({overhead:.0f} ms) = {bound:.0f} ms: "
        f"{verdict} ({medians['concurrent']:.0f} ms; {medians['concurrent'] - overhead:.0f} ms beyond the overhead, "
        f"{(medians['concurrent'] - overhead) / max(args.ms, 1):.2f} x one call)"
    )


if __name__ == "__main__":
    main()
