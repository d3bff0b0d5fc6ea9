"""A hostile secret (newlines, quotes, backslashes, non-ASCII) against a real worker, end to end.

A prefork worker (PostgreSQL ledger, Redis broker) runs a tool that reads the secret and then
returns it in a dict, raises it as ``KeyError``, logs it (with a traceback) and prints it. The
canary must appear in no PostgreSQL row, no task message still queued in Redis, no Flower API
answer, no frame of the HTTP API's SSE stream, no line of the worker's log and no CLI output.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from tests.integration.test_flower import Flower, wait_for_entries
from tests.integration.test_flower import flower as flower
from tests.support.clients import registered_client
from tests.support.processes import THREADS_CELERY, WorkerProcess, subprocess_env
from tests.support.waiting import eventually

SECRET = '-----BEGIN KEY-----\nline1-"q\'uo\\te"-canaryA\nlïne2-ünïcødé-€-canaryB\n-----END KEY-----'
FERNET_KEY = Fernet.generate_key().decode()
AGENTS = "tests.integration.secret_agents"
DEADLINE_S = 60.0
FORMS = [
    SECRET,
    *(line for line in SECRET.splitlines() if "canary" in line),
    json.dumps(SECRET)[1:-1],
    repr(SECRET)[1:-1],
    ascii(SECRET)[1:-1],
]


def leaks(blob: str) -> list[str]:
    return [form for form in FORMS if form in blob]


@pytest.fixture(scope="module")
def worker(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """Overrides the package's worker: the leaky agents, task events on, the same secret key."""
    env = subprocess_env({
        "THREADS_DATABASE_URL": migrated_pg_url, "THREADS_BROKER_URL": integration_redis_url,
        "THREADS_AGENTS": AGENTS, "THREADS_SECRET_KEY": FERNET_KEY,
    })  # fmt: skip
    process = WorkerProcess(
        "canary-w1", env=env, log_path=tmp_path_factory.mktemp("worker") / "canary-w1.log", extra_args=["-E"]
    )
    with process.running():
        yield process


@pytest.fixture(scope="module")
def flower_warmup() -> Any:
    from tests.integration.secret_agents import quiet

    return quiet


@pytest.fixture(scope="module")
def threads(worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str) -> Iterator[Any]:
    from tests.integration.secret_agents import ALL_AGENTS

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THREADS_SECRET_KEY", FERNET_KEY)
        with registered_client(migrated_pg_url, integration_redis_url, ALL_AGENTS) as client:
            yield client


def _idle_queue_messages(redis_url: str) -> list[bytes]:
    """The task messages waiting in the idle queue (kombu keeps one list per priority)."""
    import redis

    from tests.integration.secret_agents import IDLE_QUEUE

    client = redis.Redis.from_url(redis_url)
    try:
        return [raw for key in client.keys(f"{IDLE_QUEUE}*") for raw in client.lrange(key, 0, -1)]
    finally:
        client.close()


@pytest.fixture(scope="module")
def leaked_run(threads: Any, flower: Flower, integration_redis_url: str) -> Iterator[Any]:
    """The run, once its careless calls are done and its last call's message waits in Redis."""
    from tests.integration.secret_agents import leaker

    handle = threads.start(leaker, "go", env={"PRIVATE_KEY": SECRET})

    def careless_calls_committed() -> bool:
        results = [m.tool_result for m in threads.messages(handle.thread_id) if m.role == "tool"]
        return len(results) == 2

    eventually(careless_calls_committed, timeout=DEADLINE_S, what="the two careless calls committed")
    # The last call's message is published right after the commit of the call before it, by the
    # worker: wait for it to reach the idle queue (no worker consumes that queue).
    eventually(
        lambda: bool(_idle_queue_messages(integration_redis_url)),
        timeout=DEADLINE_S,
        what="the last call's task message in its idle queue",
    )
    yield threads.get_run(handle.run_id)
    threads.cancel(handle.run_id)


def test_the_ledger_holds_no_form_of_the_secret(leaked_run: Any, threads: Any, migrated_pg_url: str) -> None:
    results = [m.tool_result for m in threads.messages(leaked_run.thread_id) if m.role == "tool"]
    assert (
        [r.is_error for r in results] == [False, True]
        and "***" in results[0].content
        and "KeyError" in results[1].content
    )
    engine = create_engine(migrated_pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            tables = [
                row[0] for row in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
            ]
            dump = {
                table: [str(tuple(row)) for row in conn.execute(text(f'SELECT * FROM "{table}"'))] for table in tables
            }
    finally:
        engine.dispose()
    assert {"tool_calls", "messages", "events", "variables"} <= set(dump)
    assert {table: leaks("\n".join(rows)) for table, rows in dump.items() if leaks("\n".join(rows))} == {}


def test_no_queued_task_message_holds_the_secret(leaked_run: Any, integration_redis_url: str) -> None:
    import redis

    queued = _idle_queue_messages(integration_redis_url)
    client = redis.Redis.from_url(integration_redis_url)
    try:
        blobs: list[str] = []
        for key in client.keys("*"):
            kind = client.type(key).decode()
            values = {"list": lambda k: client.lrange(k, 0, -1), "hash": lambda k: list(client.hgetall(k).values()),
                      "string": lambda k: [client.get(k)], "zset": lambda k: client.zrange(k, 0, -1),
                      "set": lambda k: list(client.smembers(k))}.get(kind, lambda k: [])(key)  # fmt: skip
            for value in values:
                blob = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
                blobs.append(blob)
                with contextlib.suppress(ValueError, KeyError, TypeError):  # kombu's envelope: the body in base64
                    blobs.append(base64.b64decode(json.loads(blob)["body"]).decode(errors="replace"))
    finally:
        client.close()
    assert queued, "the last call's task message should be waiting in its idle queue"
    assert leaks("\n".join(blobs)) == []


def test_flower_shows_no_form_of_the_secret(leaked_run: Any, threads: Any, flower: Flower) -> None:
    [*_, last] = [c for m in threads.messages(leaked_run.thread_id) for c in m.tool_calls]
    calls = [c for m in threads.messages(leaked_run.thread_id) for c in m.tool_calls][:2]
    for call in calls:  # a call's task id is its effect key and a token of the publish
        wait_for_entries(flower, call.name, call.effect_key, ["SUCCESS"])
    text_, listing = flower.tasks()
    bodies = [text_] + [flower.get(f"/api/task/info/{task_id}")[1] for task_id in listing]
    assert leaks("\n".join(bodies)) == []
    assert last.name == "never_runs"


def test_the_sse_stream_and_the_cli_show_no_form_of_the_secret(
    leaked_run: Any, threads: Any, migrated_pg_url: str
) -> None:
    from threads_celery.api.app import create_api

    frames: list[str] = []
    url = f"/v1/threads/{leaked_run.thread_id}/events"
    with (
        TestClient(create_api(threads, tokens={"canary-token"}, keepalive_s=0.2, poll_interval_s=0.02)) as http,
        http.stream("GET", url, headers={"Authorization": "Bearer canary-token"}) as stream,
    ):
        for line in stream.iter_lines():
            frames.append(line)
            if line.startswith("data:") and "KeyError" in line:
                break
    assert any("***" in f for f in frames)
    assert leaks("\n".join(frames)) == []
    env = subprocess_env({"THREADS_DATABASE_URL": migrated_pg_url, "COLUMNS": "300"})
    for argv in (
        ["runs", "show", leaked_run.id],
        ["runs", "show", leaked_run.id, "--json"],
        ["events", leaked_run.thread_id],
    ):
        done = subprocess.run([THREADS_CELERY, *argv], env=env, capture_output=True, text=True, timeout=DEADLINE_S)
        assert done.returncode == 0, (argv, done.stderr)
        assert "***" in done.stdout and leaks(done.stdout + done.stderr) == [], argv


def test_the_worker_log_has_the_tools_lines_redacted(leaked_run: Any, worker: WorkerProcess) -> None:
    log = worker.log_path.read_text(errors="replace")
    assert "connecting with key ***" in log and "lookup failed for ***" in log and "debug: key=***" in log
    assert "Traceback" in log  # the tool's log.exception kept its traceback, redacted
    assert leaks(log) == []


@pytest.fixture(scope="module")
def raw_run(threads: Any) -> Any:
    """A run whose tool writes the secret below Python (fds 1 and 2, a subprocess, a late thread)."""
    from tests.integration.secret_agents import raw_writer

    handle = threads.start(raw_writer, "go", env={"PRIVATE_KEY": SECRET})
    run = threads.wait(handle.run_id, timeout=DEADLINE_S)
    assert run.status == "completed", run.error
    return run


def test_what_a_tool_writes_below_python_reaches_the_log_redacted(raw_run: Any, worker: WorkerProcess) -> None:
    markers = ("fd1: key=***", "fd2: key=***", "split: key=***", "child: key=***", "late: key=***", "late fd2: key=***")
    eventually(
        lambda: all(marker in worker.log_text() for marker in markers),
        timeout=DEADLINE_S,
        what="every raw write in the worker's log, redacted",
    )
    log = worker.log_path.read_text(errors="replace")
    assert ":end" in log  # the split write's second piece went out too
    assert leaks(log) == []
    assert "canaryA" not in log and "canaryB" not in log


def test_a_validation_error_shows_no_fragment_of_the_secret(raw_run: Any, threads: Any) -> None:
    [_, invalid] = [m.tool_result for m in threads.messages(raw_run.thread_id) if m.role == "tool"]
    assert invalid.is_error and "validation error" in invalid.content and "port" in invalid.content
    for fragment in ("canary", "line1", "ne2", "BEGIN KEY"):
        assert fragment not in invalid.content, invalid.content
