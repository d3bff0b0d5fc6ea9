"""What the project's Celery configuration costs every task, against a plain Celery app.

The same no-op task, a chain of N hops where each hop enqueues the next, runs in a real prefork
worker (``celery -A bench.plain_celery_app worker``, concurrency 2) on the same Redis broker,
under two configurations, alternating in one sitting (``bench/plain_celery_app.py``):

* ``plain``: Celery's defaults plus acks late and prefetch 1, as a user who wants at-least-once
  delivery configures it;
* ``project``: the configuration the project gives Celery (``celery_config``).

Printed per configuration: milliseconds per hop (between the first and the last hop's end, inside
the worker), and the CPU the worker's processes (main process and pool) spent per hop, from
``/proc``. The ratio project/plain is the configuration's cost per task. Extra ``--project-env``
settings (``THREADS_CELERY_WORKER_SEND_TASK_EVENTS=true``, ...) show what one setting costs.

Run by hand, never by CI (Redis on 127.0.0.1:6379; it flushes DB 12)::

    .venv/bin/python bench/celery_config_cost.py --n 1000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.processes import ManagedProcess, subprocess_env  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` and its descendants, now."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                pending.extend(int(child) for child in children)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def one_sitting(kind: str, n: int, broker: str, extra_env: dict[str, str], log_dir: Path) -> tuple[float, float]:
    """(ms per hop, worker CPU ms per hop) for one chain of ``n`` under configuration ``kind``."""
    import redis

    env = subprocess_env({"BENCH_CELERY_CONFIG": kind, "BENCH_BROKER_URL": broker, "BENCH_RESULTS_URL": broker})
    if kind == "project":
        env.update(extra_env)
    argv = [
        str(Path(sys.executable).with_name("celery")), "-A", "bench.plain_celery_app", "worker", "-P", "prefork",
        "-c", "2", "-l", "warning", "--without-heartbeat", "--without-gossip", "--without-mingle",
        "-n", f"cost-{kind}-{uuid.uuid4().hex[:6]}@%h",
    ]  # fmt: skip
    if kind == "project":
        argv += ["-Q", "threads"]
    process = ManagedProcess(f"{kind}-worker", argv, env=env, log_path=log_dir / f"{kind}.log", cwd=REPO)
    process.start()
    results = redis.Redis.from_url(broker)
    try:
        from bench import plain_celery_app

        sender = plain_celery_app.app
        sender.conf.update(plain_celery_app.configuration(kind, broker))
        queue = "threads" if kind == "project" else "celery"
        # Warm up: the pool processes import and connect before the measured chain.
        warm = uuid.uuid4().hex
        sender.send_task(plain_celery_app.TASK, (warm, 0, 20), queue=queue)
        _wait(results, warm, 20, process)
        chain = uuid.uuid4().hex
        cpu_before = tree_cpu_s(process.pid)
        sender.send_task(plain_celery_app.TASK, (chain, 0, n), queue=queue)
        ends = _wait(results, chain, n, process)
        cpu = tree_cpu_s(process.pid) - cpu_before
    finally:
        process.terminate(timeout=20)
        results.close()
    per_hop_ms = (max(ends) - min(ends)) / (n - 1) * 1000
    return per_hop_ms, cpu / n * 1000


def _wait(results: object, chain: str, n: int, process: ManagedProcess, timeout: float = 300.0) -> list[float]:
    deadline = time.monotonic() + timeout
    key = f"bench:{chain}"
    while time.monotonic() < deadline:
        if results.llen(key) >= n:  # type: ignore[attr-defined]
            return [float(item.split(b":")[1]) for item in results.lrange(key, 0, -1)]  # type: ignore[attr-defined]
        if not process.alive():
            raise RuntimeError(process.log_tail())
        time.sleep(0.05)
    raise TimeoutError(f"chain {chain} did not finish: {results.llen(key)} of {n}")  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="hops per chain")
    parser.add_argument("--repeat", type=int, default=3, help="alternating sittings per configuration")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/12")
    parser.add_argument(
        "--project-env", action="append", default=[], metavar="NAME=VALUE", help="a setting for the project side"
    )
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.project_env)
    import redis

    redis.Redis.from_url(args.broker).flushdb()
    samples: dict[str, list[tuple[float, float]]] = {"plain": [], "project": []}
    with tempfile.TemporaryDirectory(prefix="celery-config-cost-") as logs:
        for _ in range(args.repeat):
            for kind in ("plain", "project"):
                samples[kind].append(one_sitting(kind, args.n, args.broker, extra, Path(logs)))
                print(
                    f"  {kind:8} {samples[kind][-1][0]:.3f} ms/hop, {samples[kind][-1][1]:.3f} ms CPU/hop", flush=True
                )
    wall = {kind: statistics.median(s[0] for s in rows) for kind, rows in samples.items()}
    cpu = {kind: statistics.median(s[1] for s in rows) for kind, rows in samples.items()}
    print(f"n={args.n} repeat={args.repeat} project env: {extra or '(defaults)'}")
    print(f"{'':10}{'ms/hop':>10}{'CPU ms/hop':>12}")
    for kind in ("plain", "project"):
        print(f"{kind:10}{wall[kind]:10.3f}{cpu[kind]:12.3f}")
    print(f"{'ratio':10}{wall['project'] / wall['plain']:10.2f}{cpu['project'] / cpu['plain']:12.2f}")


if __name__ == "__main__":
    main()
