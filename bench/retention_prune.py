"""Step latency and reconcile tick time while retention prunes a million rows, against without.

Fills a fresh PostgreSQL database with ``--rows`` rows of finished history (threads of one run,
one tool call, one usage row, 20 messages and 27 events each: 50 rows a thread), all of them a
month old, plus a live run of ``bench_turns`` (a model step and a read_only call per turn),
driven in this process through ``Runtime.run_step`` and ``Runtime.run_tool`` with the publishes
kept in a list (no broker: only the ledger's work, which is what a prune competes with). Every
``--tick-every`` turns it times ``Runtime.reconcile_tick()`` over 100 runs whose lease expired
(made due again before each tick), as ``bench/reconcile_tick.py`` does.

Two phases, the same number of turns each: without a prune, then with the whole retention sweep
(every thread due: ``keep_days`` 0, ``batch_size`` as given) running in a second process, batch
after batch, each batch one read and one short transaction, as the worker's
``threads.retention_sweep`` does it, with ``--pause-ms`` between batches. (Deployed, each batch
is a task that publishes the next one, which queues behind the work waiting; the pause stands in
for that.) Prints the p50/p99 of the step latency and of the tick time in each phase, their
ratios (target: at most 1.2x), and how fast the prune went.

    .venv/bin/python bench/retention_prune.py --rows 1000000 --turns 1500
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import fresh_database, load_average  # noqa: E402

ROWS_PER_THREAD = 50
DUE_RUNS = 100


def fill(url: str, rows: int) -> int:
    """Write ``rows`` rows of month-old finished history with COPY; the number of threads."""
    import psycopg

    from threads_celery.transitions.runs import utcnow

    threads = max(1, rows // ROWS_PER_THREAD)
    old = utcnow() - timedelta(days=30)
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for start in range(0, threads, 2000):
            ids = range(start, min(threads, start + 2000))
            with cur.copy("COPY threads (id, agent, config_hash, event_seq, created_at, tenant) FROM STDIN") as copy:
                for i in ids:
                    copy.write_row((f"old-{i}", "bench_old", "x", 27, old, "default"))
            with cur.copy(
                "COPY runs (id, thread_id, agent, status, input, step, fence, output, created_at, finished_at, "
                "updated_at, lost_times, voided_requests) FROM STDIN"
            ) as copy:
                for i in ids:
                    copy.write_row(
                        (f"old-r{i}", f"old-{i}", "bench_old", "completed", "hi", 2, 6, "ok", old, old, old, 0, 0)
                    )
            with cur.copy(
                "COPY tool_calls (effect_key, run_id, thread_id, step, idx, calls_in_step, call_id, tool, args, "
                "args_hash, effect, status, attempt, is_error, created_at, finished_at, lost_times, result) FROM STDIN"
            ) as copy:
                for i in ids:
                    copy.write_row((f"old-r{i}:0:0", f"old-r{i}", f"old-{i}", 0, 0, 1, "c", "noop", "{}", "h",
                                    "read_only", "completed", 1, False, old, old, 0, "ok"))  # fmt: skip
            with cur.copy(
                "COPY model_usage (run_id, step, thread_id, agent, model, requests, input_tokens, output_tokens, "
                "created_at) FROM STDIN"
            ) as copy:
                for i in ids:
                    copy.write_row((f"old-r{i}", 0, f"old-{i}", "bench_old", "m", 1, 100, 20, old))
            with cur.copy("COPY messages (thread_id, seq, run_id, role, text, created_at) FROM STDIN") as copy:
                for i in ids:
                    for seq in range(20):
                        copy.write_row((f"old-{i}", seq, f"old-r{i}", "user" if seq % 2 == 0 else "assistant",
                                        f"message {seq} of an old conversation", old))  # fmt: skip
            with cur.copy("COPY events (thread_id, seq, run_id, type, payload, created_at) FROM STDIN") as copy:
                for i in ids:
                    for seq in range(1, 28):
                        copy.write_row((f"old-{i}", seq, f"old-r{i}", "message", '{"text": "old"}', old))
            conn.commit()
        cur.execute("ANALYZE")
        conn.commit()
    return threads


def add_due_runs(store: Any) -> list[str]:
    from sqlalchemy import insert

    from threads_celery.store.schema import runs, threads
    from threads_celery.transitions.runs import utcnow

    now = utcnow()
    ids = [f"due-{i}" for i in range(DUE_RUNS)]
    with store.transaction() as tx:
        tx.conn.execute(
            insert(threads), [{"id": "due-thread", "agent": "bench", "config_hash": "x", "created_at": now}]
        )
        tx.conn.execute(
            insert(runs),
            [
                {"id": rid, "thread_id": "due-thread", "agent": "bench", "status": "running", "input": "hi",
                 "step": 0, "fence": 1, "lease_owner": "dead", "created_at": now, "updated_at": now,
                 "lease_expires_at": now - timedelta(seconds=30)}
                for rid in ids
            ],
        )  # fmt: skip
    return ids


def make_due_again(store: Any, ids: list[str]) -> None:
    from sqlalchemy import delete, update

    from threads_celery.store.schema import outbox, runs
    from threads_celery.transitions.runs import utcnow

    with store.transaction() as tx:
        tx.conn.execute(
            update(runs)
            .where(runs.c.id.in_(ids))
            .values(status="running", lease_owner="dead", lease_expires_at=utcnow() - timedelta(seconds=30))
        )
        tx.conn.execute(delete(outbox).where(outbox.c.key.like("step:due-%")))


def prune_process(url: str, batch_size: int, pause_ms: float, report: Any, stop: Any) -> None:
    """The sweep, batch by batch, in a process of its own, until done or ``stop`` is set;
    reports rows deleted, batches and seconds."""
    from threads_celery.decisions.retention import RetentionPolicy
    from threads_celery.transitions.publishing import open_store
    from threads_celery.transitions.retention import sweep_batch
    from threads_celery.transitions.runs import utcnow

    policy = RetentionPolicy.from_mapping({"rules": [{"agent": "bench_old", "keep_days": 0}], "batch_size": batch_size})
    store = open_store(url)
    started = time.perf_counter()
    rows = batches = 0
    after = None
    while True:
        batch = sweep_batch(store, policy, now=utcnow(), after=after)
        rows += sum(batch.rows.values())
        batches += 1
        after = batch.next_after
        if after is None or stop.is_set():
            break
        time.sleep(pause_ms / 1000)
    report.put((rows, batches, time.perf_counter() - started))
    store.dispose()


def drive(runtime: Any, queue: list[Any], store: Any, due: list[str], turns: int, tick_every: int,
          stop: Any = None) -> tuple[list[float], list[float]]:  # fmt: skip
    """``turns`` turns of the live run; each step's wall time, and a tick every ``tick_every`` turns."""
    steps: list[float] = []
    ticks: list[float] = []
    done = 0
    while done < turns and queue and not (stop is not None and stop()):
        entry = queue.pop(0)
        started = time.perf_counter()
        if entry.task == "threads.step":
            runtime.run_step(*entry.args)
            steps.append(time.perf_counter() - started)
        elif entry.task == "threads.tool":
            runtime.run_tool(*entry.args)
            done += 1
            if done % tick_every == 0:
                make_due_again(store, due)
                began = time.perf_counter()
                runtime.reconcile_tick()
                ticks.append(time.perf_counter() - began)
    return steps, ticks


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--turns", type=int, default=1500, help="turns measured in each phase")
    parser.add_argument("--tick-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--pause-ms", type=float, default=0.0)
    parser.add_argument("--repeat", type=int, default=1, help="sittings, each on a database of its own")
    parser.add_argument(
        "--control", action="store_true", help="no prune in the second phase: what the phases differ by without one"
    )
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    args = parser.parse_args(argv)

    import logging

    logging.getLogger("threads_celery").setLevel(logging.ERROR)
    for sitting in range(args.repeat):
        print(
            f"retention prune, sitting {sitting + 1}/{args.repeat}: rows={args.rows} turns={args.turns} "
            f"batch_size={args.batch_size} pause={args.pause_ms}ms date={time.strftime('%Y-%m-%d %H:%M:%S %z')} "
            f"load={load_average()}"
        )
        one_sitting(args)
    return 0


def one_sitting(args: argparse.Namespace) -> None:
    from bench.bench_agents import bench_turns
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.records import OutboxEntry
    from threads_celery.runtime.machine import Runtime
    from threads_celery.transitions import runs
    from threads_celery.transitions.publishing import open_store

    with fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as url:
        began = time.perf_counter()
        threads = fill(url, args.rows)
        print(f"filled {threads} threads ({threads * ROWS_PER_THREAD} rows) in {time.perf_counter() - began:.0f} s")
        store = open_store(url)
        due = add_due_runs(store)
        registry = AgentRegistry()
        registry.add(bench_turns)
        queue: list[OutboxEntry] = []
        # The ticks re-dispatch the due runs (an agent nobody drives here): only the live run's work is kept.
        runtime = Runtime(
            store, registry, worker_id="bench-retention",
            publish=lambda entries: queue.extend(e for e in entries if not str(e.key).startswith("step:due-")),
        )  # fmt: skip
        with store.transaction() as tx:
            tx.upsert_agent(bench_turns.name, bench_turns.config_hash(), bench_turns.describe(), runs.utcnow())

        def fresh_run() -> None:
            """A new live run for each phase: both phases' steps read histories of the same lengths."""
            queue.clear()
            with store.transaction() as tx:
                _run, entries = runs.submit_run(
                    tx, agent=bench_turns.name, config_hash=bench_turns.config_hash(),
                    message=f"turns {args.turns + 60}", now=runs.utcnow(),
                )  # fmt: skip
            queue.extend(entries)
            drive(runtime, queue, store, due, 50, args.tick_every)  # warm-up

        fresh_run()
        base_steps, base_ticks = drive(runtime, queue, store, due, args.turns, args.tick_every)
        fresh_run()
        if args.control:
            during_steps, during_ticks = drive(runtime, queue, store, due, args.turns, args.tick_every)
            rows, batches, seconds = 0, 0, 0.0
        else:
            spawn = multiprocessing.get_context("spawn")
            report: Any = spawn.Queue()
            stop = spawn.Event()
            pruner = spawn.Process(target=prune_process, args=(url, args.batch_size, args.pause_ms, report, stop))
            pruner.start()
            time.sleep(1.0)  # the pruner's imports and first batch
            during_steps, during_ticks = drive(
                runtime, queue, store, due, args.turns, args.tick_every, stop=lambda: not pruner.is_alive()
            )
            stop.set()  # a paced prune may outlast the turns measured: what it did so far is its speed
            rows, batches, seconds = report.get(timeout=600)
            pruner.join()
        store.dispose()

    if seconds:
        print(
            f"prune: {rows} rows in {batches} batches, {seconds:.1f} s ({rows / seconds:,.0f} rows/s; stopped once measured)"
        )
    else:
        print("control: no prune in the second phase")
    print(f"measured during the prune: {len(during_steps)} steps, {len(during_ticks)} ticks")
    print(f"{'':24}{'p50 ms':>9}{'p99 ms':>9}")
    for label, values in (("step, no prune", base_steps), ("step, during prune", during_steps),
                          ("tick, no prune", base_ticks), ("tick, during prune", during_ticks)):  # fmt: skip
        print(f"{label:24}{pct(values, 0.5):9.2f}{pct(values, 0.99):9.2f}")
    print(f"ratio step p99: {pct(during_steps, 0.99) / pct(base_steps, 0.99):.2f}x (target <= 1.2x)")
    print(f"ratio tick p99: {pct(during_ticks, 0.99) / pct(base_ticks, 0.99):.2f}x (target <= 1.2x)")
    print(f"ratio tick median: {statistics.median(during_ticks) / statistics.median(base_ticks):.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
