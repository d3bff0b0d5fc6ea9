"""The DESIGN.md section-11 anchor: a DBOS Transact workflow of sequential no-op steps.

A durable turn (a model step plus a tool call) is two transitions; DESIGN.md compares it with
two DBOS steps on the same PostgreSQL. This runs a workflow of ``--steps`` no-op steps and prints
the wall and CPU time per step (median of ``--repeat``), to be read next to
``bench/history_length.py`` in the same sitting.

DBOS is not a dependency of this project: run it from a virtualenv of its own::

    python3 -m venv /tmp/dbos && /tmp/dbos/bin/pip install dbos
    /tmp/dbos/bin/python bench/dbos_steps.py --steps 200 --repeat 5

It creates a fresh PostgreSQL database for DBOS's system tables and drops it at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args(argv)

    import psycopg
    from dbos import DBOS, DBOSConfig

    name = f"tc_bench_dbos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        config: DBOSConfig = {"name": "bench-steps", "system_database_url": f"{args.pg}/{name}"}
        DBOS(config=config)

        @DBOS.step()
        def noop() -> str:
            return "ok"

        @DBOS.workflow()
        def sequence(n: int) -> int:
            for _ in range(n):
                noop()
            return n

        DBOS.launch()
        sequence(10)  # warm-up
        walls, cpus = [], []
        for _ in range(args.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            sequence(args.steps)
            walls.append((time.perf_counter() - wall) * 1000 / args.steps)
            cpus.append((time.process_time() - cpu) * 1000 / args.steps)
        DBOS.destroy()
        print(
            f"DBOS sequential no-op step: wall {statistics.median(walls):.2f} ms (min {min(walls):.2f}), "
            f"CPU {statistics.median(cpus):.2f} ms (min {min(cpus):.2f}); two steps: "
            f"{2 * statistics.median(walls):.2f} ms; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
    finally:
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
