"""threads_celery.testing.start_worker on RabbitMQ against Redis: start, stop, and a twenty-step run.

    .venv/bin/python bench/in_process_worker_brokers.py --cycles 5

Each cycle is what one user's integration test does: start the in-process worker, run an agent
of twenty sequential steps (nineteen tool calls and a reply) on PostgreSQL, stop the worker.
Prints the median of each phase per broker and RabbitMQ's over Redis's, and the worker threads
left behind. The RabbitMQ side runs on a vhost of its own (made and deleted with rabbitmqctl);
Redis on DB 5 of 127.0.0.1:6379 (flushed). A fresh PostgreSQL database, dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time
import uuid
from typing import Any

import psycopg
from pydantic import BaseModel

from threads_celery import Agent, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say, start_worker


class CountIn(BaseModel):
    n: int


def _count(inp: CountIn, ctx: Any) -> str:
    return f"counted {inp.n}"


count = tool(name="count", description="Count.", input=CountIn, effect="read_only", execute=_count)
twenty = Agent(
    name="bench-twenty-steps",
    instructions="Count.",
    model=ScriptedModel([call("count", n=i) for i in range(19)] + [say("done")]),
    tools=[count],
    permissions=Permissions.allow_all(),
)


def cycles(database_url: str, broker_url: str, n: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {"start": [], "twenty steps": [], "stop": []}
    threads = Threads(database_url=database_url, broker_url=broker_url)
    threads.migrate()
    threads.register(twenty)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            with start_worker(threads, reconcile_interval=None):
                t1 = time.perf_counter()
                run = threads.wait(threads.start(twenty, "go").run_id, timeout=120)
                assert run.status == "completed", run
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            timings["start"].append(t1 - t0)
            timings["twenty steps"].append(t2 - t1)
            timings["stop"].append(t3 - t2)
    finally:
        threads.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--pg", default="host=127.0.0.1 user=postgres dbname=postgres")
    args = parser.parse_args()
    database = f"bench_brokers_{uuid.uuid4().hex[:8]}"
    vhost = f"bench-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True)
    subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True)
    import redis

    redis.Redis(db=5).flushdb()
    try:
        url = f"postgresql://postgres@127.0.0.1/{database}"
        results = {
            "redis": cycles(url, "redis://127.0.0.1:6379/5", args.cycles),
            "rabbitmq": cycles(url, f"amqp://guest:guest@127.0.0.1:5672/{vhost}", args.cycles),
        }
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], check=False)
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    print(f"{'phase':<14}{'redis s':>10}{'rabbitmq s':>12}{'ratio':>8}   (median of {args.cycles})")
    for phase in ("start", "twenty steps", "stop"):
        r, q = (statistics.median(results[b][phase]) for b in ("redis", "rabbitmq"))
        print(f"{phase:<14}{r:>10.3f}{q:>12.3f}{q / r:>8.2f}")
    left = [t.name for t in threading.enumerate() if t.name.startswith("threads-embedded")]
    print(f"worker threads left behind: {len(left)}")


if __name__ == "__main__":
    main()
