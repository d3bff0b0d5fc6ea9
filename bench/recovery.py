"""Recovery after a whole worker is SIGKILLed mid-call, with a backlog of work queued.

Each trial, on a PostgreSQL and a Redis of the bench's own (``tests/support/processes.py``:
``initdb`` and ``redis-server`` on free ports, never the machine's services):

1. two real prefork workers (``celery -A tasks worker``, concurrency 2) and a real Beat
   (``celery -A tasks beat``, a tick every ``--tick`` s) run with ``--lease`` s leases;
2. a run of ``bench.bench_recovery_agents`` starts an idempotent call that sleeps;
3. ``--backlog`` work messages are queued (steps of runs that do not exist: each reads the ledger
   and does nothing, as a duplicate delivery does; published with the queue and priority the
   runtime gives work, and topped up until that many wait in Redis);
4. the worker running the call is SIGKILLed as a process group, and the bench measures, from
   the kill:

   - **re-dispatch**: the backbone fenced the dead worker off and put the call back in the queue
     (the run's fence moved on);
   - **re-run**: the call's second attempt started on the surviving worker (the effect decision
     ran: the message did not wait behind the backlog);
   - how much of the backlog was still queued at the re-run.

Target: median re-dispatch at most lease + 2 ticks with 1,000 queued. Prints the medians and their
ratio to that target.

    .venv/bin/python bench/recovery.py --backlog 1000 --lease 2 --tick 0.5 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.private_services import PrivatePostgres, PrivateRedis  # noqa: E402
from tests.support.processes import (  # noqa: E402
    BeatProcess,
    WorkerProcess,
    exit_cleanly_on_sigterm,
    queued_messages,
    subprocess_env,
)
from tests.support.waiting import eventually  # noqa: E402
from threads_celery import Settings, Threads  # noqa: E402
from threads_celery.decisions.backbone import message_priority  # noqa: E402
from threads_celery.definitions.agents import AgentRegistry  # noqa: E402
from threads_celery.store.schema import runs, tool_calls  # noqa: E402
from threads_celery.transitions.runs import STEP_TASK  # noqa: E402
from threads_celery.worker.application import create_app  # noqa: E402

AGENTS = "bench.bench_recovery_agents"


@dataclass(frozen=True)
class Trial:
    redispatch_s: float
    rerun_s: float
    queued_at_kill: int
    queued_at_rerun: int


def queue_backlog(broker_url: str, count: int) -> None:
    """``count`` work messages with the queue and priority the runtime gives work, sent over one
    connection so that the backlog is in place before the workers can drain much of it."""
    app = create_app(Settings(), AgentRegistry(), broker_url=broker_url)
    tag = uuid.uuid4().hex[:8]
    priority = message_priority(STEP_TASK, recovered=False, broker_url=broker_url)
    with app.producer_or_acquire() as producer:
        for i in range(count):
            run_id = f"run_backlog_{tag}_{i}"
            app.send_task(STEP_TASK, args=(run_id, 0), task_id=f"step:{run_id}:0", priority=priority, producer=producer)


def one_trial(threads: Threads, env: dict[str, str], broker_url: str, *, backlog: int, workdir: Path) -> Trial:
    import redis

    from bench.bench_recovery_agents import agent

    redis.Redis.from_url(broker_url).flushdb()
    name = uuid.uuid4().hex[:6]
    workers = [
        WorkerProcess(f"a{name}", env=env, log_path=workdir / f"a{name}.log", concurrency=2),
        WorkerProcess(f"b{name}", env=env, log_path=workdir / f"b{name}.log", concurrency=2),
    ]
    beat = BeatProcess(
        f"beat{name}", env=env, log_path=workdir / f"beat{name}.log", schedule_path=workdir / f"beat{name}"
    )
    try:
        for process in (*workers, beat):
            process.start()
        for worker in workers:
            worker.wait_ready()
        beat.wait_ready()
        handle = threads.start(agent, "go")

        def running_call() -> tuple[str, int] | None:
            with threads.store.read() as tx:
                row = tx.conn.execute(select(runs.c.lease_owner, runs.c.fence).where(runs.c.id == handle.run_id)).one()
                attempt = tx.conn.execute(
                    select(tool_calls.c.attempt).where(tool_calls.c.run_id == handle.run_id)
                ).scalar()
            return (row.lease_owner, row.fence) if attempt and row.lease_owner else None

        owner, fence = eventually(running_call, timeout=60, what="the call running")
        pid = int(owner.rsplit(":", 1)[1])
        victim = next(w for w in workers if w.owns(pid))
        queue_backlog(broker_url, backlog)
        # The workers drain some while it is published: top it up, so the kill finds N queued.
        while (queued := queued_messages(broker_url)) < backlog:
            queue_backlog(broker_url, backlog - queued + backlog // 5)
        queued_at_kill = queued_messages(broker_url)
        victim.kill()
        killed = time.monotonic()

        def fence_moved() -> bool:
            with threads.store.read() as tx:
                return tx.conn.execute(select(runs.c.fence).where(runs.c.id == handle.run_id)).scalar_one() > fence

        eventually(fence_moved, timeout=300, what="re-dispatch", interval=0.01)
        redispatch = time.monotonic() - killed

        def rerun() -> bool:
            with threads.store.read() as tx:
                return (
                    tx.conn.execute(
                        select(tool_calls.c.attempt).where(tool_calls.c.run_id == handle.run_id)
                    ).scalar_one()
                    >= 2
                )

        eventually(rerun, timeout=300, what="the second attempt", interval=0.01)
        return Trial(redispatch, time.monotonic() - killed, queued_at_kill, queued_messages(broker_url))
    finally:
        for process in (*workers, beat):
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=1000, help="work messages queued before the kill")
    parser.add_argument("--lease", type=float, default=2.0, help="step and tool lease, seconds")
    parser.add_argument("--tick", type=float, default=0.5, help="Beat's reconcile interval, seconds")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    exit_cleanly_on_sigterm()

    with (
        tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp,
        PrivatePostgres() as postgres,
        PrivateRedis() as broker,
    ):
        database_url = postgres.create_database("bench_recovery")
        broker_url = broker.url(0)
        env = subprocess_env(
            {
                "THREADS_DATABASE_URL": database_url,
                "THREADS_BROKER_URL": broker_url,
                "THREADS_AGENTS": AGENTS,
                "THREADS_TOOL_LEASE_S": str(args.lease),
                "THREADS_STEP_LEASE_S": str(args.lease),
                "THREADS_RECONCILE_INTERVAL_S": str(args.tick),
            }
        )
        os.environ.update({k: env[k] for k in ("THREADS_TOOL_LEASE_S", "THREADS_STEP_LEASE_S")})
        from bench.bench_recovery_agents import agent

        threads = Threads(database_url=database_url, broker_url=broker_url, migrate=True)
        threads.register(agent)
        try:
            load = os.getloadavg()[0]
            trials = [
                one_trial(threads, env, broker_url, backlog=args.backlog, workdir=Path(tmp)) for _ in range(args.repeat)
            ]
        finally:
            threads.close()
    target = args.lease + 2 * args.tick
    redispatch = statistics.median(t.redispatch_s for t in trials)
    rerun = statistics.median(t.rerun_s for t in trials)
    print(f"backlog {args.backlog}, lease {args.lease} s, tick {args.tick} s, {args.repeat} trials")
    print(f"load average (1 min) before {load:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"re-dispatch: median {redispatch:.2f} s  {[round(t.redispatch_s, 2) for t in trials]}")
    print(f"re-run:      median {rerun:.2f} s  {[round(t.rerun_s, 2) for t in trials]}")
    print(f"queued at kill {[t.queued_at_kill for t in trials]}, at re-run {[t.queued_at_rerun for t in trials]}")
    print(
        f"target lease + 2 ticks = {target:.2f} s; re-dispatch / target = {redispatch / target:.2f}, re-run / target = {rerun / target:.2f}"
    )


if __name__ == "__main__":
    main()
