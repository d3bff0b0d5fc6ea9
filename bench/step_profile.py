"""Where a turn's milliseconds go: one run driven in-process, profiled early and late.

Drives one run of ``--turns`` turns of ``bench_turns`` (a model step calling a no-op
``read_only`` tool, on a constant-cost model) through ``Runtime.run_step`` and
``Runtime.run_tool`` in this process, against a fresh PostgreSQL database, publishing into a
list instead of a broker (so the publish, the broker hop and Celery are left out: profile a
worker for those, ``bench/throughput.py --profile DIR``). Two windows of turns are profiled with
cProfile: turns 11-30 and the last 20. For each window it prints the CPU time per turn (without
the profiler), and the profiled time per turn by where it was spent: our code, SQLAlchemy,
psycopg (the driver), Pydantic AI, asyncio (the event loop
of each step), JSON, and the rest.

Run by hand::

    .venv/bin/python bench/step_profile.py --turns 1000
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import fresh_database  # noqa: E402

CATEGORIES = (
    ("threads_celery", "/threads_celery/"),
    ("sqlalchemy", "/sqlalchemy/"),
    ("psycopg", "/psycopg/"),
    ("pydantic_ai", "/pydantic_ai/"),
    ("pydantic", "/pydantic/"),
    ("asyncio", "/asyncio/"),
    ("json", "/json/"),
    ("bench model", "/bench/"),
)


def category(filename: str) -> str:
    for name, marker in CATEGORIES:
        if marker in filename:
            return name
    return "other"


def by_category(profile: cProfile.Profile) -> dict[str, float]:
    """Own time (tottime) per category, in seconds."""
    stats = pstats.Stats(profile)
    totals: dict[str, float] = {}
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = category(filename)
        totals[key] = totals.get(key, 0.0) + tottime
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--top", type=int, default=0, help="also print the N functions with most own time, late window")
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    args = parser.parse_args(argv)

    from bench.bench_agents import bench_turns, time_model_layer
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.records import OutboxEntry
    from threads_celery.runtime.machine import Runtime
    from threads_celery.transitions import runs
    from threads_celery.transitions.publishing import open_store

    print(
        f"step profile: turns={args.turns} date={time.strftime('%Y-%m-%d %H:%M:%S %z')} "
        f"load={' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    early_range = range(10, 10 + args.window)
    late_range = range(args.turns - args.window, args.turns)
    profiles = {"early": cProfile.Profile(time.process_time), "late": cProfile.Profile(time.process_time)}
    cpu: dict[str, list[float]] = {"early": [], "late": []}
    model_cpu: dict[str, list[float]] = {"early": [], "late": []}
    in_model = [0.0]
    time_model_layer(lambda seconds: in_model.__setitem__(0, in_model[0] + seconds))
    with fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as url:
        store = open_store(url)
        registry = AgentRegistry()
        registry.add(bench_turns)
        queue: list[OutboxEntry] = []
        runtime = Runtime(store, registry, publish=queue.extend, worker_id="bench-profile")
        with store.transaction() as tx:
            tx.upsert_agent(bench_turns.name, bench_turns.config_hash(), bench_turns.describe(), runs.utcnow())
            _run, entries = runs.submit_run(
                tx,
                agent=bench_turns.name,
                config_hash=bench_turns.config_hash(),
                message=f"turns {args.turns}",
                now=runs.utcnow(),
            )
        queue.extend(entries)
        turn = 0
        pending_cpu = 0.0
        profiled = {name: 0 for name in profiles}
        while queue:
            entry = queue.pop(0)
            window = "early" if turn in early_range else "late" if turn in late_range else None
            # Every other turn is profiled; the others give the CPU time without the profiler.
            use_profile = window is not None and turn % 2 == 0
            started = time.process_time()
            if use_profile:
                profiles[window].enable()  # type: ignore[index]
            if entry.task == "threads.step":
                runtime.run_step(*entry.args)
            else:
                runtime.run_tool(*entry.args)
            if use_profile:
                profiles[window].disable()  # type: ignore[index]
            pending_cpu += time.process_time() - started
            if entry.task == "threads.tool":  # a turn ends with its call
                if window is not None and not use_profile:
                    cpu[window].append(pending_cpu * 1000)
                    model_cpu[window].append(in_model[0] * 1000)
                if use_profile:
                    profiled[window] += 1  # type: ignore[index]
                pending_cpu = 0.0
                in_model[0] = 0.0
                turn += 1
        store.dispose()

    print(
        f"\nper turn (model step + tool call), in-process, no broker: CPU ms median (min) over {args.window // 2} turns"
    )
    for name in ("early", "late"):
        label = (
            f"turns {early_range.start + 1}-{early_range.stop}"
            if name == "early"
            else f"turns {late_range.start + 1}-{late_range.stop}"
        )
        print(f"  {label:<22}{statistics.median(cpu[name]):7.2f} ({min(cpu[name]):.2f})")
    print(f"  late / early: {statistics.median(cpu['late']) / statistics.median(cpu['early']):.2f}")
    runtime = {name: [c - m for c, m in zip(cpu[name], model_cpu[name], strict=True)] for name in cpu}
    print("  of which the model layer (pydantic_ai.direct's request, the model, the stream), and the runtime:")
    for name in ("early", "late"):
        print(f"  {name:<22}{statistics.median(model_cpu[name]):7.2f}  {statistics.median(runtime[name]):7.2f}")
    print(f"  late / early, runtime: {statistics.median(runtime['late']) / statistics.median(runtime['early']):.2f}")
    print("\nprofiled own CPU time per turn, ms (the profiler inflates every figure; read the shares):")
    totals = {name: by_category(profiles[name]) for name in profiles}
    keys = sorted({k for t in totals.values() for k in t}, key=lambda k: -totals["late"].get(k, 0.0))
    print(f"  {'':<16}{'early':>9}{'late':>9}")
    for key in keys:
        early = totals["early"].get(key, 0.0) * 1000 / max(profiled["early"], 1)
        late = totals["late"].get(key, 0.0) * 1000 / max(profiled["late"], 1)
        print(f"  {key:<16}{early:>9.2f}{late:>9.2f}")
    if args.top:
        print()
        pstats.Stats(profiles["late"]).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
