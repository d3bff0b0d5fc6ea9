"""The scale model's figures, measured on the fleet of tests/fleet (network namespaces; run as root).

    .venv/bin/python bench/fleet_scale.py --runs 300

16 worker processes (6, 5 and 5 on the hosts w1, w2 and w3) and Beat work a backlog of ``--runs``
runs of the chaos suite's agents (every effect class; tools that do not sleep, so the figures are
the runtime's own), twice: through PgBouncer (transaction pooling) and straight to PostgreSQL.
Per run it prints the statements, commits and round trips the fleet's role sent to PostgreSQL
(pg_stat_statements and pg_stat_database, the test's own reading excluded), the statements a
start costs the client, PostgreSQL's and the workers' CPU seconds (from /proc), and the
connections PostgreSQL held and the workers opened, sampled while the backlog drained.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.chaos import chaos_agents  # noqa: E402
from tests.chaos.soak_checks import SETTLED  # noqa: E402
from tests.fleet.cluster import HOSTS, WORKER_HOSTS, WORKER_USER, Fleet  # noqa: E402
from tests.fleet.network import Network  # noqa: E402

CONCURRENCY = (6, 5, 5)
KINDS = ["read_only", "idempotent", "reconcilable", "unguarded"]
TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])  # utime stime cutime cstime
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return total / TICKS


def tree(pid: int) -> list[int]:
    pids, todo = [pid], [pid]
    while todo:
        current = todo.pop()
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                found = [int(p) for p in children.read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            pids += found
            todo += found
    return pids


def stats(fleet: Fleet) -> dict[str, float]:
    rows = fleet.query(
        "select coalesce(sum(s.calls), 0) as calls, "
        "coalesce(sum(s.calls) filter (where s.query ~* '^(begin|commit|rollback)'), 0) as tx_control "
        "from pg_stat_statements s join pg_roles r on r.oid = s.userid where r.rolname = :role",
        {"role": WORKER_USER},
    )
    commits = fleet.query("select xact_commit from pg_stat_database where datname = :db", {"db": fleet.database})
    return {"calls": float(rows[0].calls), "tx_control": float(rows[0].tx_control), "commits": float(commits[0][0])}


def client_calls(fleet: Fleet) -> float:
    rows = fleet.query(
        "select coalesce(sum(s.calls), 0) from pg_stat_statements s join pg_roles r on r.oid = s.userid "
        "where r.rolname = 'postgres' and s.query !~* 'pg_stat'"
    )
    return float(rows[0][0])


def bouncer_clients(fleet: Fleet) -> int:
    """Client connections the workers hold to PgBouncer (its SHOW POOLS, the fleet's role)."""
    import psycopg

    from tests.fleet.cluster import BOUNCER_PORT

    with psycopg.connect(host=str(fleet.pg_dir), port=BOUNCER_PORT, user="postgres", dbname="pgbouncer",
                         autocommit=True, prepare_threshold=None) as conn:  # fmt: skip
        cursor = conn.execute("SHOW POOLS")
        names = [c.name for c in cursor.description or []]
        total = 0
        for row in cursor.fetchall():
            entry = dict(zip(names, row, strict=False))
            if entry.get("user") == WORKER_USER:
                total += int(entry.get("cl_active", 0)) + int(entry.get("cl_idle", 0)) + int(entry.get("cl_waiting", 0))
        return total


def measure(runs: int, *, through_bouncer: bool, seed: int) -> dict[str, Any]:
    network = Network(HOSTS)
    directory = Path(tempfile.mkdtemp(prefix="fleet-scale-"))  # the processes' logs, removed at the end
    fleet = Fleet(network, directory)
    fleet.through_bouncer = through_bouncer
    try:
        network.create()
        fleet.start_services()
        workers = [
            fleet.start_worker(wait=False, concurrency=n, FLEET_HOST=host)
            for host, n in zip(WORKER_HOSTS, CONCURRENCY, strict=True)
        ]
        fleet.start_beat(wait=False)
        for worker in workers:
            worker.wait_ready(timeout=180)
        fleet.threads.store.engine.dispose()
        fleet.query("select pg_stat_statements_reset()")
        rng = random.Random(seed)
        before_client = client_calls(fleet)
        agents = [chaos_agents.AGENTS[rng.choice(KINDS)] for _ in range(runs)]
        assert fleet.postgres is not None
        pg_pids = tree(fleet.postgres.pid)
        worker_pids = [pid for w in workers for pid in tree(w.pid)]
        cpu0 = (cpu_seconds(tree(fleet.postgres.pid)), cpu_seconds(worker_pids))
        start_stats = stats(fleet)
        began = time.monotonic()
        ids = [fleet.threads.start(agent, chaos_agents.message(uuid.uuid4().hex[:12])).run_id for agent in agents]
        start_s = time.monotonic() - began
        client = client_calls(fleet) - before_client
        samples: list[tuple[int, int]] = []
        clients: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                rows = fleet.query(
                    "select count(*) filter (where usename = :role and client_addr is not null), "
                    "count(*) filter (where usename = :role and client_addr is null) from pg_stat_activity",
                    {"role": WORKER_USER},
                )
                samples.append((int(rows[0][0]), int(rows[0][1])))
                if through_bouncer:
                    clients.append(bouncer_clients(fleet))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        pending = set(ids)
        while pending and time.monotonic() - began < 600:
            rows = fleet.query("select id, status from runs where id = any(:ids)", {"ids": list(pending)})
            pending -= {r.id for r in rows if r.status in SETTLED}
            time.sleep(1.0)
        elapsed = time.monotonic() - began
        stop.set()
        sampler.join()
        end_stats = stats(fleet)
        pg_pids = tree(fleet.postgres.pid)
        cpu1 = (cpu_seconds(pg_pids), cpu_seconds([pid for w in workers for pid in tree(w.pid)]))
        statuses = fleet.query("select status, count(*) from runs group by 1")
        direct = max((s[0] for s in samples), default=0)
        via_socket = max((s[1] for s in samples), default=0)
        return {
            "through_bouncer": through_bouncer,
            "runs": runs,
            "unsettled": len(pending),
            "statuses": {r[0]: r[1] for r in statuses},
            "elapsed_s": elapsed,
            "start_s": start_s,
            "client_statements_per_start": client / runs,
            "statements_per_run": (
                end_stats["calls"] - start_stats["calls"] - (end_stats["tx_control"] - start_stats["tx_control"])
            )
            / runs,
            "round_trips_per_run": (end_stats["calls"] - start_stats["calls"]) / runs,
            "commits_per_run": (end_stats["commits"] - start_stats["commits"]) / runs,
            "pg_cpu_s_per_run": (cpu1[0] - cpu0[0]) / runs,
            "worker_cpu_s_per_run": (cpu1[1] - cpu0[1]) / runs,
            "pg_connections_peak": max(direct, via_socket),
            "pg_connections_median": statistics.median([max(a, b) for a, b in samples]) if samples else 0,
            "bouncer_client_connections_peak": max(clients, default=0),
            "worker_processes": sum(CONCURRENCY),
        }
    finally:
        fleet.close()
        network.destroy()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args()
    for through_bouncer in (True, False):
        result = measure(args.runs, through_bouncer=through_bouncer, seed=args.seed)
        print(f"\n{'through PgBouncer' if through_bouncer else 'straight to PostgreSQL'}")
        for key, value in result.items():
            print(f"  {key:<30} {value:.3f}" if isinstance(value, float) else f"  {key:<30} {value}")


if __name__ == "__main__":
    main()
