"""What the benchmarks that drive a real worker share: their services and the worker's traces.

A fresh, migrated PostgreSQL database (:func:`fresh_database`), the command-line options naming
the services (:func:`add_service_options`), a flushed Redis (:func:`flushed_redis`), a real
``celery -A tasks worker`` (:func:`worker`) with its environment (:func:`worker_env`), the start
of a run once the worker has registered its agents (:func:`when_registered`), and the per-task
records the worker writes (:func:`read_traces`, :func:`wait_done`, ``bench/bench_agents.py``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.processes import ManagedProcess  # noqa: E402

AGENTS_MODULE = "bench.bench_agents"

T = TypeVar("T")


# -- services -----------------------------------------------------------------------------------


def add_service_options(parser: argparse.ArgumentParser, *, redis_db: int) -> None:
    """``--redis-url`` (the broker, Redis DB ``redis_db``, flushed) and ``--pg-host/--pg-port/--pg-user``."""
    parser.add_argument("--redis-url", default=f"redis://127.0.0.1:6379/{redis_db}", help="broker; this DB is flushed")
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")


def flushed_redis(url: str) -> Any:
    """A client of the Redis DB at ``url``, flushed."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    return client


def load_average() -> str:
    """The machine's load averages (1, 5, 15 min), as the benchmarks print them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextmanager
def fresh_database(host: str, port: int, user: str, keep: bool) -> Iterator[str]:
    """A new, migrated PostgreSQL database; dropped afterwards unless ``keep``."""
    import psycopg
    from psycopg import sql
    from sqlalchemy import create_engine

    from threads_celery.store.migrate import upgrade

    name = f"tc_bench_{uuid.uuid4().hex[:12]}"
    admin = {"host": host, "port": port, "user": user, "dbname": "postgres", "autocommit": True}
    with psycopg.connect(**admin) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    url = f"postgresql+psycopg://{user}@{host}:{port}/{name}"
    try:
        engine = create_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        yield url
    finally:
        if keep:
            print(f"kept database {name}")
        else:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            deadline = time.monotonic() + 60
            while True:  # the server may be restarting (other tests on the machine): try again
                try:
                    with psycopg.connect(**admin, connect_timeout=5) as conn:
                        conn.execute(drop)
                    break
                except psycopg.OperationalError:
                    if time.monotonic() > deadline:
                        print(f"could not drop database {name}", file=sys.stderr)
                        raise
                    time.sleep(1)


@contextmanager
def worker(
    env: dict[str, str], concurrency: int, log_path: Path, loglevel: str = "warning"
) -> Iterator[ManagedProcess]:
    """A real ``celery -A tasks worker`` in its own process group, stopped (warm) at the end."""
    command = [
        str(Path(sys.executable).with_name("celery")), "-A", "tasks", "worker", "-P", "prefork",
        "-c", str(concurrency), "-I", AGENTS_MODULE, "-l", loglevel,
        "--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
    ]  # fmt: skip
    process = ManagedProcess("bench-worker", command, env=env, log_path=log_path, cwd=REPO)
    process.start()
    try:
        yield process
    finally:
        process.terminate(timeout=20)


def worker_env(database_url: str, broker_url: str, trace_dir: str) -> dict[str, str]:
    """The environment of :func:`worker`: this repository importable, the ledger, the broker, the
    bench's agents and where the worker writes its per-task records."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "THREADS_DATABASE_URL": database_url,
        "THREADS_BROKER_URL": broker_url,
        "THREADS_AGENTS": AGENTS_MODULE,
        "BENCH_TRACE_DIR": trace_dir,
    }


def when_registered(start: Callable[[], T], timeout: float = 120.0) -> T:
    """``start()``, tried again while the worker, coming up, has not registered its agents yet."""
    from threads_celery.exceptions import UnknownAgent

    deadline = time.monotonic() + timeout
    while True:
        try:
            return start()
        except UnknownAgent:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# -- traces -------------------------------------------------------------------------------------


def read_traces(directory: str, key: str) -> list[dict[str, Any]]:
    records = []
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    if record["key"] == key:
                        records.append(record)
    return sorted(records, key=lambda r: r["t1"])


def wait_done(redis_client: Any, key: str, timeout: float) -> dict[str, Any]:
    from bench.bench_agents import DONE_PREFIX

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        popped = redis_client.blpop([DONE_PREFIX + key], timeout=1)
        if popped is not None:
            return json.loads(popped[1])
    raise TimeoutError(f"{key} did not finish within {timeout}s")


__all__ = [
    "AGENTS_MODULE",
    "REPO",
    "add_service_options",
    "flushed_redis",
    "fresh_database",
    "load_average",
    "read_traces",
    "wait_done",
    "when_registered",
    "worker",
    "worker_env",
]
