"""Recovery time after a whole worker is SIGKILLed mid-call: the backbone against the broker.

A real worker (prefork, Redis broker, PostgreSQL ledger) starts an idempotent tool call that
sleeps; the bench SIGKILLs the worker's whole process group and starts a second worker at once.

- backbone: a reconcile tick every ``--tick`` seconds; the run moves again once the call's
  lease (``--lease``) has lapsed.
- broker: no reconcile tick; the run moves again only when Redis hands the unacknowledged
  message to the second worker after the visibility timeout (``--visibility``; Celery's default
  is 3600 s, shortened here so the bench finishes).

"Moves again" means the call's second attempt started (attempt 2 in the ledger). Prints the
seconds for each and their ratio.

    .venv/bin/python bench/recovery.py --lease 2 --tick 0.5 --visibility 20 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import redis
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from threads_celery import Threads  # noqa: E402
from threads_celery.store.schema import tool_calls  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
BROKER = "redis://127.0.0.1:6379/11"


def start_worker(env: dict[str, str], log: Path, name: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "prefork", "--concurrency", "1",
        "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "--loglevel", "INFO",
    ]
    handle = log.open("wb")
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while b"ready." not in log.read_bytes():
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"worker {name} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    return process


def kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(10)


def poll(predicate, timeout: float, step: float = 0.02) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError("condition not met in time")
        time.sleep(step)
    return time.monotonic() - started


def attempt(threads: Threads, effect_key_prefix: str) -> int:
    with threads.store.read() as tx:
        rows = tx.conn.execute(
            select(tool_calls.c.attempt).where(tool_calls.c.effect_key.like(f"{effect_key_prefix}%"))
        ).scalars().all()
    return max(rows, default=0)


def one_trial(database_url: str, *, lease: float, tick: float | None, visibility: int, workdir: Path) -> float:
    redis.Redis.from_url(BROKER).flushdb()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "THREADS_DATABASE_URL": database_url,
        "THREADS_BROKER_URL": BROKER,
        "THREADS_AGENTS": "bench.bench_recovery_agents",
        "THREADS_TOOL_LEASE_S": str(lease),
        "THREADS_STEP_LEASE_S": str(lease),
        "THREADS_VISIBILITY_TIMEOUT_S": str(visibility),
        "THREADS_TASK_TIME_LIMIT_S": str(max(1, visibility // 2)),
        "THREADS_TASK_SOFT_TIME_LIMIT_S": str(max(1, visibility // 2 - 1)),
    }
    os.environ.update({k: env[k] for k in ("THREADS_TOOL_LEASE_S", "THREADS_STEP_LEASE_S")})
    from bench.bench_recovery_agents import agent

    threads = Threads(database_url=database_url, broker_url=BROKER, migrate=True)
    threads.register(agent)
    first = start_worker(env, workdir / f"a-{uuid.uuid4().hex[:6]}.log", f"a{uuid.uuid4().hex[:6]}")
    second = None
    stop_ticks = threading.Event()
    ticker = None
    try:
        handle = threads.start(agent, "go")
        poll(lambda: attempt(threads, handle.run_id) >= 1, 30)
        kill_group(first)
        killed_at = time.monotonic()
        second = start_worker(env, workdir / f"b-{uuid.uuid4().hex[:6]}.log", f"b{uuid.uuid4().hex[:6]}")
        if tick is not None:
            def tick_loop() -> None:
                while not stop_ticks.wait(tick):
                    try:
                        threads.reconcile()
                    except Exception as exc:  # noqa: BLE001 - a bench keeps ticking
                        print("tick failed:", exc, file=sys.stderr)

            ticker = threading.Thread(target=tick_loop, daemon=True)
            ticker.start()
        poll(lambda: attempt(threads, handle.run_id) >= 2, visibility * 3 + 60)
        return time.monotonic() - killed_at
    finally:
        stop_ticks.set()
        if ticker is not None:
            ticker.join(5)
        kill_group(first)
        if second is not None:
            kill_group(second)
        threads.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--tick", type=float, default=0.5)
    parser.add_argument("--visibility", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    name = f"bench_recovery_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    database_url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            backbone = [one_trial(database_url, lease=args.lease, tick=args.tick, visibility=args.visibility, workdir=Path(tmp)) for _ in range(args.repeat)]
            broker = [one_trial(database_url, lease=args.lease, tick=None, visibility=args.visibility, workdir=Path(tmp)) for _ in range(args.repeat)]
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    b, r = statistics.median(backbone), statistics.median(broker)
    print(f"lease {args.lease}s, tick {args.tick}s, visibility timeout {args.visibility}s, {args.repeat} trials each")
    print(f"backbone (lease + tick): median {b:.2f}s  {[round(x, 2) for x in backbone]}")
    print(f"broker redelivery:       median {r:.2f}s  {[round(x, 2) for x in broker]}")
    print(f"ratio backbone / broker: {b / r:.3f} (with Celery's default 3600 s visibility timeout the broker path takes an hour)")


if __name__ == "__main__":
    main()
