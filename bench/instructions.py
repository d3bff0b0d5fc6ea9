"""CPU per tool call and per turn as instructions counted by valgrind: a figure load does not move.

On a shared or virtual machine, CPU time per task moves by 10-20% from one run to the next with
nothing changed (the neighbours, the clock speed), which hides any change smaller than that.
Callgrind counts the instructions a process executes instead: the same code, inputs and
environment give the same count, however busy the machine is. This drives the runtime
in-process (as ``bench/step_profile.py`` does: ``Runtime.run_step`` and ``Runtime.run_tool``
against a fresh PostgreSQL database, publishing into a list, so the broker, the publish and
Celery are left out, and the database server's own work is not counted) twice under callgrind,
with ``--small`` and ``--large`` units of work, and prints the difference per unit: start-up,
imports and the database's creation cancel out.

With ``--broker-url`` (a Redis DB, flushed) every task is also published there through the
runtime's publisher, as a worker publishes it (nothing consumes it): the publish is counted too.

Units: ``calls`` is one model reply making N ``read_only`` no-op calls in sequence (a unit is one
call); ``turns`` is a run of N turns of ``bench_turns`` (a unit is a model step and its call,
with the history growing from ``--small`` to ``--large`` turns).

Run by hand (about three minutes; needs ``valgrind``)::

    .venv/bin/python bench/instructions.py --kind calls
    .venv/bin/python bench/instructions.py --kind turns --small 40 --large 120

Compare two trees by running each one's copy of this script with its own interpreter.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def drive(kind: str, units: int, broker_url: str | None = None) -> None:
    """Run ``units`` of work in this process (what callgrind counts); with ``broker_url`` (a
    Redis URL whose DB is flushed), each task is also published there, as a worker would."""
    from bench.bench_agents import bench_noop, bench_turns
    from bench.harness import fresh_database
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.records import OutboxEntry
    from threads_celery.runtime.machine import Runtime
    from threads_celery.transitions import runs
    from threads_celery.transitions.publishing import open_store

    agent, message = (bench_noop, f"noop_ro {units}") if kind == "calls" else (bench_turns, f"turns {units}")
    with fresh_database("127.0.0.1", 5432, "postgres", False) as url:
        store = open_store(url)
        registry = AgentRegistry()
        registry.add(agent)
        queue: list[OutboxEntry] = []
        publish = queue.extend
        if broker_url is not None:
            from threads_celery.settings import Settings
            from threads_celery.transitions.publishing import Publisher, celery_app

            publisher = Publisher(celery_app(Settings(), broker_url=broker_url))

            def publish(entries: Sequence[OutboxEntry]) -> None:
                publisher(entries)
                queue.extend(entries)

        runtime = Runtime(store, registry, publish=publish, worker_id="bench-instructions")
        with store.transaction() as tx:
            tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), runs.utcnow())
            _run, entries = runs.submit_run(
                tx, agent=agent.name, config_hash=agent.config_hash(), message=message, now=runs.utcnow()
            )
        queue.extend(entries)
        while queue:
            entry = queue.pop(0)
            if entry.task == "threads.step":
                runtime.run_step(*entry.args)
            else:
                runtime.run_tool(*entry.args)
        store.dispose()
    if broker_url is not None:
        import redis

        redis.Redis.from_url(broker_url).flushdb()


def count(kind: str, units: int, broker_url: str | None) -> int:
    """Instructions callgrind counts for a whole run of ``units``."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--drive",
            kind,
            str(units),
            *(["--broker-url", broker_url] if broker_url else []),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("calls", "turns"), default="calls")
    parser.add_argument("--small", type=int, default=100, help="units in the first run (default 100)")
    parser.add_argument("--large", type=int, default=500, help="units in the second run (default 500)")
    parser.add_argument("--broker-url", help="also publish every task to this Redis DB (flushed), as a worker does")
    parser.add_argument("--drive", nargs=2, metavar=("KIND", "UNITS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive:
        drive(args.drive[0], int(args.drive[1]), args.broker_url)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    small, large = count(args.kind, args.small, args.broker_url), count(args.kind, args.large, args.broker_url)
    per_unit = (large - small) / (args.large - args.small)
    unit = "call" if args.kind == "calls" else "turn (a model step and its call)"
    print(f"instructions: {args.small} units {small:,}, {args.large} units {large:,}")
    print(f"per {unit}: {per_unit / 1000:,.0f} thousand")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
