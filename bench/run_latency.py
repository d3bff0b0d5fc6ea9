"""A run's fixed costs: from ``threads.start()`` to the first model call, and a short run whole.

Both measured one at a time on an idle, warm worker (``celery -A tasks worker -P prefork``, the
project's Celery settings, on Redis), against a bare Celery task in the same worker:

* **start to first model call**: the wall time from just before ``threads.start()`` to the first
  model call of the run's first step, read in the worker (``model_at`` of the step's trace), and
  the bare side's enqueue-to-start: from just before ``send_task`` to the task's start in the
  worker. Split into the client's ``start()`` (its transaction and the publish) and the rest (the
  hop, the step's claim and history read). The target (issue 25) is at most 2x the bare task's.
* **a run of K turns** (default 10), start to end: from just before ``threads.start()`` to the end
  of the run's last task in the worker, per turn; and, apart, to the return of ``threads.wait()``,
  which is what a caller sees. Read against two DBOS steps in a workflow of 2K steps, its start
  and end included (``bench/dbos_steps.py --steps 20``, from DBOS's own virtualenv).

Run by hand, never by CI::

    .venv/bin/python bench/run_latency.py --n 200 --turns 10

It creates a fresh database (dropped at the end) and uses Redis DB 13, which it flushes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
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

TARGET_START_RATIO = 2.0


def bare_start(app: Any, redis_client: Any, trace_dir: str, timeout: float) -> float:
    """Seconds from just before ``send_task`` to the bare task's start in the worker."""
    from bench.bench_agents import CHAIN_TASK

    key = f"chain_{uuid.uuid4().hex}"
    sent = time.time()
    app.send_task(CHAIN_TASK, args=[0, key], task_id=f"{key}:0", argsrepr=f"{key}:0")
    wait_done(redis_client, key, timeout)
    (record,) = read_traces(trace_dir, key)
    return float(record["t0"]) - sent


def durable_start(threads: Any, redis_client: Any, trace_dir: str, timeout: float) -> tuple[float, float, float]:
    """(start to first model call, ``start()`` itself, ``start()`` returned to the step's start), seconds."""
    before = time.time()
    handle = threads.start(AGENT[0], "turns 0")
    returned = time.time()
    wait_done(redis_client, handle.run_id, timeout)
    step = next(r for r in read_traces(trace_dir, handle.run_id) if r["task"] == "threads.step")
    return float(step["model_at"]) - before, returned - before, float(step["t0"]) - returned


def whole_run(threads: Any, redis_client: Any, trace_dir: str, turns: int, timeout: float) -> tuple[float, int]:
    """(seconds from just before ``start()`` to the end of the run's last task, tasks run)."""
    before = time.time()
    handle = threads.start(AGENT[0], f"turns {turns}")
    done = wait_done(redis_client, handle.run_id, timeout)
    if not str(done["retval"]).startswith("completed"):
        raise RuntimeError(f"run {handle.run_id} ended {done['retval']}")
    return float(done["t"]) - before, len(read_traces(trace_dir, handle.run_id))


def waited_run(threads: Any, turns: int, timeout: float) -> float:
    """Seconds from just before ``start()`` to the return of ``threads.wait()``."""
    before = time.perf_counter()
    handle = threads.start(AGENT[0], f"turns {turns}")
    run = threads.wait(handle.run_id, timeout=timeout)
    if run.status != "completed":
        raise RuntimeError(f"run {run.id} ended {run.status}: {run.error}")
    return time.perf_counter() - before


#: What ``start()`` is given: the agent's name, or with ``--agent-object`` the Agent itself (as a
#: Python caller usually passes it; the client then hashes its configuration).
AGENT: list[Any] = ["bench_turns"]


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"{statistics.median(values) * 1000:7.2f} ms (min {min(values) * 1000:.2f}, p90 {p90 * 1000:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="samples of each start latency (default 200)")
    parser.add_argument("--turns", type=int, default=10, help="turns of the whole runs (default 10)")
    parser.add_argument("--runs", type=int, default=30, help="whole runs of each kind (default 30)")
    parser.add_argument("--concurrency", type=int, default=2, help="worker prefork processes (default 2)")
    add_service_options(parser, redis_db=13)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--agent-object", action="store_true", help="start() with the Agent, not its name")
    args = parser.parse_args(argv)
    if args.agent_object:
        from bench.bench_agents import bench_turns

        AGENT[0] = bench_turns

    redis_client = flushed_redis(args.redis_url)
    print(
        f"run latency: n={args.n} turns={args.turns} runs={args.runs} concurrency={args.concurrency} "
        f"start with={'the Agent' if args.agent_object else 'its name'} "
        f"cpus={os.cpu_count()} python={platform.python_version()} date={time.strftime('%Y-%m-%d %H:%M:%S %z')} "
        f"load={load_average()}"
    )
    with (
        fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as database_url,
        tempfile.TemporaryDirectory(prefix="tc-bench-") as trace_dir,
    ):
        env = worker_env(database_url, args.redis_url, trace_dir)
        from threads_celery import Threads

        threads = Threads(database_url=database_url, broker_url=args.redis_url)
        bare: list[float] = []
        durable: list[float] = []
        start_call: list[float] = []
        to_step: list[float] = []
        whole: list[float] = []
        waited: list[float] = []
        tasks = 0
        try:
            with worker(env, args.concurrency, Path(trace_dir) / "worker.log"):
                for _ in range(10):  # warm up: imports, connections, the agent's first step
                    bare_start(threads.app, redis_client, trace_dir, args.timeout)
                    durable_start(threads, redis_client, trace_dir, args.timeout)
                whole_run(threads, redis_client, trace_dir, args.turns, args.timeout)
                for _ in range(args.n):  # alternating, so that a change in the machine hits both
                    bare.append(bare_start(threads.app, redis_client, trace_dir, args.timeout))
                    total, call, rest = durable_start(threads, redis_client, trace_dir, args.timeout)
                    durable.append(total)
                    start_call.append(call)
                    to_step.append(rest)
                for _ in range(args.runs):
                    seconds, tasks = whole_run(threads, redis_client, trace_dir, args.turns, args.timeout)
                    whole.append(seconds / args.turns)
                    waited.append(waited_run(threads, args.turns, args.timeout) / args.turns)
        finally:
            threads.close()
    redis_client.flushdb()
    ratio = statistics.median(durable) / statistics.median(bare)
    print()
    print(f"bare task, enqueue to start:            {ms(bare)}")
    print(f"durable run, start() to first model call: {ms(durable)}")
    print(f"  of which start() itself:               {ms(start_call)}")
    print(f"  start() returned to the step's start:  {ms(to_step)}")
    print(
        f"ratio (medians): {ratio:.2f}; target <= {TARGET_START_RATIO}: "
        f"{'ok' if ratio <= TARGET_START_RATIO else 'MISSED'}"
    )
    print()
    print(f"a run of {args.turns} turns ({tasks} tasks), per turn:")
    print(f"  start() to the last task's end:        {ms(whole)}")
    print(f"  start() to threads.wait() returning:   {ms(waited)}")
    print("  read against two DBOS steps of a 2K-step workflow: bench/dbos_steps.py --steps 20")
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
