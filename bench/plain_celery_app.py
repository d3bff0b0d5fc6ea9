"""The Celery app of ``bench/celery_config_cost.py``: one no-op task that enqueues the next.

``BENCH_CELERY_CONFIG`` picks the configuration the worker runs under:

* ``plain``: Celery's defaults plus what a user who wants at-least-once delivery sets (acks late,
  prefetch 1), JSON, no result backend, the default ``celery`` queue;
* ``project``: the configuration this project gives Celery (``celery_config``), the same task.

Each hop records its end time in Redis (``BENCH_RESULTS_URL``), so the runner measures between
task ends inside the worker, as ``bench/tool_call_overhead.py`` does.

``bench.plain_chain`` is the plain side of ``bench/throughput.py``: the same no-op as the
durable runs' tool and the project's bare chains, a chain of tasks each enqueueing the next,
whose last task says so on Redis (``BENCH_DONE_URL``) as the project's bare chains do.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12")
RESULTS = redis.Redis.from_url(os.environ.get("BENCH_RESULTS_URL", "redis://127.0.0.1:6379/12"))
KIND = os.environ.get("BENCH_CELERY_CONFIG", "plain")
TASK = "bench.hop"
CHAIN_TASK = "bench.plain_chain"
DONE_PREFIX = "bench:done:"  # bench_agents.DONE_PREFIX; not imported, so the plain worker loads no project code
DONE = redis.Redis.from_url(os.environ.get("BENCH_DONE_URL", os.environ.get("BENCH_RESULTS_URL", BROKER)))


def configuration(kind: str, broker: str) -> dict[str, Any]:
    """The Celery settings of ``kind`` (``plain`` or ``project``) on ``broker``."""
    if kind == "plain":
        return {
            "broker_url": broker,
            "task_acks_late": True,
            "worker_prefetch_multiplier": 1,
            "task_serializer": "json",
            "accept_content": ["json"],
            "result_backend": None,
            "task_ignore_result": True,
            "broker_connection_retry_on_startup": True,
        }
    from threads_celery.settings import Settings
    from threads_celery.transitions.publishing import celery_config

    return celery_config(Settings.from_env(), broker)  # THREADS_* of the environment: --project-env


app = Celery("bench_plain", set_as_current=True)
app.conf.update(configuration(KIND, BROKER))


@app.task(name=TASK, acks_late=True)
def hop(chain: str, i: int, n: int) -> None:
    """Record this hop's end, then enqueue the next one (the last hop enqueues nothing)."""
    if i + 1 < n:
        hop.apply_async((chain, i + 1, n))
    RESULTS.rpush(f"bench:{chain}", f"{i}:{time.time()}")


@app.task(name=CHAIN_TASK, acks_late=True)
def plain_chain(remaining: int, key: str) -> str:
    """The no-op, then the next link; the last one pushes the chain's end (``bench/throughput.py``)."""
    if remaining > 0:
        plain_chain.apply_async((remaining - 1, key))
        return "next"
    DONE.rpush(DONE_PREFIX + key, json.dumps({"t": time.time(), "retval": "last"}))
    return "last"
