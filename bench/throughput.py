"""Throughput: N durable runs of K turns started at once, against N Celery chains of 2K tasks.

Three sides, on the same broker, alternating round by round:

* **plain**: chains in a plain Celery app (``bench/plain_celery_app.py``: Celery's defaults
  plus acks late and prefetch 1, JSON, no result backend, no task events), in a worker of its
  own with the same number of prefork processes. This is what a user would run instead, and
  the baseline of the targets;
* **bare**: the same chains in the project's worker (``celery -A tasks worker -P prefork``,
  the project's Celery settings), which shows what the configuration itself costs;
* **durable**: runs of K turns in the project's worker: K model steps that each call a no-op
  ``read_only`` tool, then a closing model step: 2K+1 tasks.

A chain of 2K is 2K+1 tasks, each doing the same no-op and enqueueing the next. The model is a
constant-cost function model (``bench_turns`` in ``bench/bench_agents.py``), so what the
durable side pays beyond the chains is the ledger, not the model. Both workers stay up for the
whole sitting; the one not being measured is idle.

Printed per side (median of ``--repeat``): wall time from the first start to the last end,
runs per second, and the CPU time the measured worker (main process plus pool processes, read
from ``/proc``) used per task. Then the ratios durable / plain and durable / bare.

Run by hand, never by CI::

    .venv/bin/python bench/throughput.py --runs 100 --turns 5 --concurrency 4
    .venv/bin/python bench/throughput.py --broker-url amqp://guest:guest@127.0.0.1:5672//

It creates a fresh PostgreSQL database (dropped at the end). With a Redis broker it flushes the
broker's DB (default DB 12); with RabbitMQ the "finished" signals go to ``--done-url`` (Redis).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import fresh_database, load_average, worker, worker_env  # noqa: E402
from tests.support.processes import ManagedProcess, subprocess_env  # noqa: E402

#: Issue 25's targets, durable over the plain Celery app's chains, by broker.
TARGET_RATIO = {"redis": 1.6, "amqp": 2.0}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def count_connections(database_url: str) -> int:
    """Sessions open on the bench's database (the worker's pools and the driver's)."""
    import psycopg

    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://").split("?")[0]) as conn:
        row = conn.execute("SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def group_cpu_seconds(pgid: int) -> float:
    """User plus system CPU of every live process in the process group ``pgid`` (the worker)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state ppid pgrp ... utime(12) stime(13), counted from state.
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def leader_cpu_seconds(pid: int) -> float:
    """User plus system CPU of the process ``pid`` alone (the worker's main process)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


#: The servers a round also keeps busy, by process name: the database and either broker.
SERVERS = {"postgres": "postgres", "redis-server": "broker", "beam.smp": "broker"}


def server_cpu_seconds() -> dict[str, float]:
    """User plus system CPU of every live PostgreSQL, Redis and RabbitMQ process, by role.

    Read off the whole machine: run nothing else against these servers while measuring.
    """
    totals = dict.fromkeys(SERVERS.values(), 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, _, tail = f.read().rpartition(")")
        except OSError:
            continue
        role = SERVERS.get(head.partition("(")[2])
        if role is not None:
            fields = tail.split()
            totals[role] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return totals


@dataclass
class Sample:
    wall_s: float
    cpu_s: float
    tasks: int
    #: CPU the servers spent over the round (PostgreSQL, the broker), in seconds.
    server_s: dict[str, float] = field(default_factory=dict)
    #: CPU of the worker's main process (Celery's consumer) alone, in seconds.
    main_s: float = float("nan")

    @property
    def main_ms_per_task(self) -> float:
        return self.main_s * 1000 / self.tasks

    def server_ms_per_task(self, role: str) -> float:
        return self.server_s.get(role, float("nan")) * 1000 / self.tasks

    @property
    def cpu_ms_per_task(self) -> float:
        return self.cpu_s * 1000 / self.tasks


def wait_all(redis_client: Any, keys: list[str], timeout: float) -> None:
    from bench.bench_agents import DONE_PREFIX

    deadline = time.monotonic() + timeout
    pending = [DONE_PREFIX + k for k in keys]
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(pending)} of {len(keys)} did not finish within {timeout}s")
        popped = redis_client.blpop(pending, timeout=min(left, 1.0))
        if popped is not None:
            pending.remove(popped[0].decode())


def run_bare(app: Any, redis_client: Any, pgid: int, runs: int, turns: int, timeout: float) -> Sample:
    from bench.bench_agents import CHAIN_TASK

    n = 2 * turns
    keys = [f"chain_{uuid.uuid4().hex}" for _ in range(runs)]
    main0 = leader_cpu_seconds(pgid)
    servers0, cpu0, t0 = server_cpu_seconds(), group_cpu_seconds(pgid), time.perf_counter()
    for key in keys:
        app.send_task(CHAIN_TASK, args=[n, key], task_id=f"{key}:{n}", argsrepr=f"{key}:{n}")
    wait_all(redis_client, keys, timeout)
    wall = time.perf_counter() - t0
    cpu, servers = group_cpu_seconds(pgid) - cpu0, server_cpu_seconds()
    main = leader_cpu_seconds(pgid) - main0
    return Sample(wall, cpu, runs * (n + 1), {k: v - servers0[k] for k, v in servers.items()}, main)


def run_plain(app: Any, redis_client: Any, pgid: int, runs: int, turns: int, timeout: float) -> Sample:
    from bench.plain_celery_app import CHAIN_TASK

    n = 2 * turns
    keys = [f"plain_{uuid.uuid4().hex}" for _ in range(runs)]
    main0 = leader_cpu_seconds(pgid)
    servers0, cpu0, t0 = server_cpu_seconds(), group_cpu_seconds(pgid), time.perf_counter()
    for key in keys:
        app.send_task(CHAIN_TASK, args=[n, key])
    wait_all(redis_client, keys, timeout)
    wall = time.perf_counter() - t0
    cpu, servers = group_cpu_seconds(pgid) - cpu0, server_cpu_seconds()
    main = leader_cpu_seconds(pgid) - main0
    return Sample(wall, cpu, runs * (n + 1), {k: v - servers0[k] for k, v in servers.items()}, main)


@contextmanager
def plain_worker(broker_url: str, done_url: str, concurrency: int, log_path: Path) -> Iterator[ManagedProcess]:
    """A worker of the plain Celery app, in its own process group, stopped at the end."""
    env = subprocess_env({
        "BENCH_CELERY_CONFIG": "plain", "BENCH_BROKER_URL": broker_url, "BENCH_RESULTS_URL": done_url,
        "BENCH_DONE_URL": done_url,
    })  # fmt: skip
    argv = [
        str(Path(sys.executable).with_name("celery")), "-A", "bench.plain_celery_app", "worker", "-P", "prefork",
        "-c", str(concurrency), "-l", "warning", "--without-heartbeat", "--without-gossip", "--without-mingle",
        "-n", f"plain-{uuid.uuid4().hex[:6]}@%h",
    ]  # fmt: skip
    process = ManagedProcess("plain-worker", argv, env=env, log_path=log_path, cwd=REPO)
    process.start()
    try:
        yield process
    finally:
        process.terminate(timeout=20)


def run_durable(threads: Any, redis_client: Any, pgid: int, runs: int, turns: int, timeout: float) -> Sample:
    main0 = leader_cpu_seconds(pgid)
    servers0, cpu0, t0 = server_cpu_seconds(), group_cpu_seconds(pgid), time.perf_counter()
    handles = [threads.start("bench_turns", f"turns {turns}") for _ in range(runs)]
    wait_all(redis_client, [h.run_id for h in handles], timeout)
    wall = time.perf_counter() - t0
    cpu, servers = group_cpu_seconds(pgid) - cpu0, server_cpu_seconds()
    main = leader_cpu_seconds(pgid) - main0
    for handle in handles:
        run = threads.get_run(handle.run_id)
        if run.status != "completed":
            raise RuntimeError(f"run {run.id} ended {run.status}: {run.error}")
    return Sample(wall, cpu, runs * (2 * turns + 1), {k: v - servers0[k] for k, v in servers.items()}, main)


def report_collections(trace_dir: Path, *, executed: int) -> None:
    """What the cyclic garbage collector cost the project's pool processes (``--gc``)."""
    by_generation: dict[str, list[float]] = {}
    frozen = []
    for path in trace_dir.glob("*.gc.json"):
        found = json.loads(path.read_text())
        frozen.append(found["frozen"])
        for generation, (count, seconds) in found["collections"].items():
            entry = by_generation.setdefault(generation, [0, 0.0])
            entry[0] += count
            entry[1] += seconds
    total = sum(seconds for _count, seconds in by_generation.values())
    print(f"garbage collection in {len(frozen)} pool processes over {executed} tasks (warm-up included):")
    for generation, (count, seconds) in sorted(by_generation.items()):
        print(f"  generation {generation}: {int(count)} collections, {seconds * 1000:.1f} ms CPU")
    print(f"  in all {total * 1000:.1f} ms, {total * 1000 / max(executed, 1):.3f} ms/task; objects frozen: {frozen}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs (and chains) started at once (default 100)")
    parser.add_argument("--turns", type=int, default=5, help="turns per run; chains have 2K+1 tasks (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds of each side (default 3)")
    parser.add_argument("--concurrency", type=int, default=4, help="worker prefork processes (default 4)")
    parser.add_argument(
        "--broker-url",
        default="redis://127.0.0.1:6379/12",
        help="broker (a Redis DB is flushed; amqp://guest:guest@127.0.0.1:5672// for RabbitMQ)",
    )
    parser.add_argument(
        "--done-url",
        default="redis://127.0.0.1:6379/12",
        help="Redis for the finished signals (the broker's DB when the broker is Redis)",
    )
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    parser.add_argument(
        "--pg-options",
        default="",
        help="query string added to the database URL, e.g. prepare_threshold=none behind PgBouncer",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one round")
    parser.add_argument("--json", metavar="PATH", help="also write the samples as JSON")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile (CPU time) each pool process over the durable rounds only; stats to DIR",
    )
    parser.add_argument(
        "--gc",
        action="store_true",
        help="time the cyclic garbage collector in the project's pool processes (all its rounds)",
    )
    args = parser.parse_args(argv)

    import redis

    on_redis = args.broker_url.startswith("redis")
    done_url = args.broker_url if on_redis else args.done_url
    redis_client = redis.Redis.from_url(done_url)
    redis_client.flushdb()
    print(
        f"throughput: runs={args.runs} turns={args.turns} repeat={args.repeat} concurrency={args.concurrency} "
        f"broker={args.broker_url.split('@')[-1]} cpus={os.cpu_count()} python={platform.python_version()} "
        f"date={time.strftime('%Y-%m-%d %H:%M:%S %z')} load={load_average()}"
    )
    results: dict[str, list[Sample]] = {"plain": [], "bare": [], "durable": []}
    connections = 0
    with (
        fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as database_url,
        tempfile.TemporaryDirectory(prefix="tc-bench-") as trace_dir,
    ):
        if args.pg_options:
            database_url = f"{database_url}?{args.pg_options}"
        env = {
            **worker_env(database_url, args.broker_url, trace_dir),
            "BENCH_DONE_URL": done_url,
            **({"BENCH_PROFILE": "cpu"} if args.profile else {}),
            **({"BENCH_GC": "1"} if args.gc else {}),
        }
        from threads_celery import Threads

        log_path = Path(trace_dir) / "worker.log"
        threads = Threads(database_url=database_url, broker_url=args.broker_url)
        os.environ.update({"BENCH_BROKER_URL": args.broker_url, "BENCH_DONE_URL": done_url})
        from bench import plain_celery_app

        plain_app = plain_celery_app.app
        plain_app.conf.update(plain_celery_app.configuration("plain", args.broker_url))
        nothing = Sample(float("nan"), float("nan"), 1)
        try:
            with (
                worker(env, args.concurrency, log_path) as process,
                plain_worker(args.broker_url, done_url, args.concurrency, Path(trace_dir) / "plain.log") as plain,
            ):
                pgid = process.pid  # the worker leads its own session and process group
                # Warm up every side: imports, connections in every pool process.
                warm = max(args.concurrency * 2, 4)
                run_plain(plain_app, redis_client, plain.pid, warm, 2, 120.0)
                run_bare(threads.app, redis_client, pgid, warm, 2, 120.0)
                run_durable(threads, redis_client, pgid, warm, 2, 120.0)
                for i in range(args.repeat):
                    if args.profile:
                        plain_s = bare = nothing
                    else:
                        plain_s = run_plain(plain_app, redis_client, plain.pid, args.runs, args.turns, args.timeout)
                        bare = run_bare(threads.app, redis_client, pgid, args.runs, args.turns, args.timeout)
                    durable = run_durable(threads, redis_client, pgid, args.runs, args.turns, args.timeout)
                    results["plain"].append(plain_s)
                    results["bare"].append(bare)
                    results["durable"].append(durable)
                    print(
                        f"  round {i + 1}: plain {plain_s.wall_s:.2f} s ({plain_s.cpu_ms_per_task:.2f} cpu ms/task), "
                        f"bare {bare.wall_s:.2f} s ({bare.cpu_ms_per_task:.2f}), "
                        f"durable {durable.wall_s:.2f} s ({durable.cpu_ms_per_task:.2f}), "
                        f"ratio to plain {durable.wall_s / plain_s.wall_s:.2f}",
                        flush=True,
                    )
                if not process.alive() or not plain.alive():
                    raise RuntimeError("a worker exited during the benchmark")
                connections = count_connections(database_url)
        except Exception:
            for log_file in (log_path, Path(trace_dir) / "plain.log"):
                if log_file.exists():
                    print(f"--- {log_file.name} ---", file=sys.stderr)
                    print(log_file.read_text()[-5000:], file=sys.stderr)
            raise
        finally:
            threads.close()
        if args.gc:
            report_collections(
                Path(trace_dir), executed=2 * (warm * 5 + args.repeat * args.runs * (2 * args.turns + 1))
            )
        if args.profile:
            import shutil

            os.makedirs(args.profile, exist_ok=True)
            for prof in Path(trace_dir).glob("*.prof"):
                shutil.copy(prof, args.profile)
            print(f"profiles in {args.profile} (python -m pstats)")
            return 0
    redis_client.flushdb()

    def med(kind: str, field: str) -> float:
        return statistics.median(getattr(s, field) for s in results[kind])

    def low(kind: str, field: str) -> float:
        return min(getattr(s, field) for s in results[kind])

    sides = (
        ("plain", f"plain Celery chains of {2 * args.turns}"),
        ("bare", f"project's chains of {2 * args.turns}"),
        ("durable", f"durable runs of {args.turns} turns"),
    )
    tasks = args.runs * (2 * args.turns + 1)
    print()
    print(f"{args.runs} at once, {2 * args.turns + 1} tasks each ({tasks} tasks), median (min) of {args.repeat}:")
    print(f"{'':<34}{'wall s':>14}{'runs/s':>9}{'cpu ms/task':>16}")
    for kind, label in sides:
        print(
            f"{label:<34}{med(kind, 'wall_s'):>7.2f} ({low(kind, 'wall_s'):.2f}){args.runs / med(kind, 'wall_s'):>9.1f}"
            f"{med(kind, 'cpu_ms_per_task'):>8.2f} ({low(kind, 'cpu_ms_per_task'):.2f})"
        )
    print(f"{'':<34}{'cpu ms/task: worker main':>25}{'pool':>7}{'PostgreSQL':>12}{'broker':>8}")
    for kind, label in sides:
        main_ms = med(kind, "main_ms_per_task")
        pg_ms = statistics.median(s.server_ms_per_task("postgres") for s in results[kind])
        broker_ms = statistics.median(s.server_ms_per_task("broker") for s in results[kind])
        pool_ms = med(kind, "cpu_ms_per_task") - main_ms
        print(f"{label:<34}{main_ms:>25.2f}{pool_ms:>7.2f}{pg_ms:>12.2f}{broker_ms:>8.2f}")
    target = TARGET_RATIO["redis" if on_redis else "amqp"]
    for base in ("plain", "bare"):
        ratios = [d.wall_s / b.wall_s for b, d in zip(results[base], results["durable"], strict=True)]
        cpu_ratios = [d.cpu_s / b.cpu_s for b, d in zip(results[base], results["durable"], strict=True)]
        ratio = statistics.median(ratios)
        verdict = f"; target wall <= {target}: {'ok' if ratio <= target else 'MISSED'}" if base == "plain" else ""
        print(
            f"ratio durable / {base}: wall {ratio:.2f} (min {min(ratios):.2f}), "
            f"worker cpu {statistics.median(cpu_ratios):.2f} (min {min(cpu_ratios):.2f}){verdict}"
        )
    print(
        f"PostgreSQL sessions open on the database at the end (worker of {args.concurrency} and driver): {connections}"
    )
    print(f"load average at the end: {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps({k: [vars(s) for s in v] for k, v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
