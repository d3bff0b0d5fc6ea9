"""Worker memory over many runs: RSS after 1,000 runs against RSS after 10,000.

A real prefork worker on Redis drives ``--runs`` durable runs of ``bench_turns`` (each a model
step calling a no-op ``read_only`` tool, then a closing step: three tasks), started in batches of
``--batch`` at once. After each checkpoint the resident set size (VmRSS from ``/proc``) of the
worker's main process and of each pool process is read; the line at the end compares the total
after the last checkpoint with the total after the first. Pool processes are not recycled
(``--max-tasks-per-child`` is unset, as the project runs them).

Run by hand, never by CI::

    .venv/bin/python bench/memory.py --runs 10000 --checkpoints 1000 2000 5000 10000

It creates a fresh database (dropped at the end) and uses Redis DB 13, which it flushes.
"""

from __future__ import annotations

import argparse
import os
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
    when_registered,
    worker,
    worker_env,
)
from bench.throughput import run_bare, run_durable  # noqa: E402

TARGET = 1.10


def group_rss_kib(pgid: int) -> dict[int, int]:
    """VmRSS (KiB) of every live process in the process group ``pgid``, by pid."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        found[int(entry)] = int(line.split()[1])
        except (OSError, ValueError):
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[1000, 2000, 5000, 10_000])
    parser.add_argument("--batch", type=int, default=200, help="runs started at once (default 200)")
    parser.add_argument("--turns", type=int, default=1, help="turns per run (default 1)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--bare",
        action="store_true",
        help="bare Celery chains of the same shape instead of durable runs (the baseline)",
    )
    add_service_options(parser, redis_db=13)
    args = parser.parse_args(argv)
    checkpoints = sorted(c for c in args.checkpoints if c <= args.runs)

    redis_client = flushed_redis(args.redis_url)
    print(
        f"memory: {'bare chains' if args.bare else 'durable runs'}: runs={args.runs} batch={args.batch} turns={args.turns} concurrency={args.concurrency} "
        f"date={time.strftime('%Y-%m-%d %H:%M:%S %z')} load={load_average()}"
    )
    rows: list[tuple[int, dict[int, int]]] = []
    with (
        fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as database_url,
        tempfile.TemporaryDirectory(prefix="tc-bench-") as trace_dir,
    ):
        env = worker_env(database_url, args.redis_url, trace_dir)
        from threads_celery import Threads

        threads = Threads(database_url=database_url, broker_url=args.redis_url)
        log_path = Path(trace_dir) / "worker.log"
        try:
            with worker(env, args.concurrency, log_path) as process:
                pgid = process.pid
                when_registered(lambda: run_durable(threads, redis_client, pgid, 1, args.turns, 120.0))
                done, started = 0, time.monotonic()
                for checkpoint in checkpoints:
                    while done < checkpoint:
                        n = min(args.batch, checkpoint - done)
                        if args.bare:
                            run_bare(threads.app, redis_client, pgid, n, args.turns, 600.0)
                        else:
                            run_durable(threads, redis_client, pgid, n, args.turns, 600.0)
                        done += n
                        # The per-task trace lines are the bench's, not the worker's: keep the disk small.
                        for trace in Path(trace_dir).glob("*.jsonl"):
                            trace.write_text("")
                    rss = group_rss_kib(pgid)
                    rows.append((checkpoint, rss))
                    print(
                        f"  after {checkpoint:>6} runs ({time.monotonic() - started:6.0f} s): "
                        f"total {sum(rss.values()) / 1024:7.1f} MiB  "
                        + "  ".join(f"{pid}: {kib / 1024:.1f}" for pid, kib in sorted(rss.items()))
                    )
                if not process.alive():
                    raise RuntimeError("the worker exited during the benchmark")
        except Exception:
            if log_path.exists():
                print(log_path.read_text()[-5000:], file=sys.stderr)
            raise
        finally:
            threads.close()
    redis_client.flushdb()
    (first_n, first), (last_n, last) = rows[0], rows[-1]
    ratio = sum(last.values()) / sum(first.values())
    pools = [pid for pid in first if pid in last and pid != pgid]
    pool_ratio = sum(last[p] for p in pools) / max(sum(first[p] for p in pools), 1)
    print(
        f"RSS after {last_n} runs / after {first_n}: worker total {ratio:.3f}, pool processes {pool_ratio:.3f}; "
        f"target <= {TARGET}: {'ok' if ratio <= TARGET else 'MISSED'}"
    )
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
