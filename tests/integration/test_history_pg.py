"""Export, read-back, erasure, holds and a prune by hand, on PostgreSQL with a real worker.

The worker (prefork, Redis) runs :mod:`tests.integration.history_agents`; the client on the same
ledger exports, erases and prunes. What is checked is the ledger itself: every table a thread
has rows in, before and after.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.integration import history_agents
from tests.support.clients import registered_client
from tests.support.processes import THREADS_CELERY, WorkerProcess, subprocess_env

AGENTS = "tests.integration.history_agents"
TABLES_BY_THREAD = ("messages", "events", "runs", "tool_calls", "model_usage", "variables", "permission_grants")


@pytest.fixture(scope="module")
def secret_key() -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    mp.setenv("THREADS_SECRET_KEY", history_agents.FERNET_KEY)
    yield history_agents.FERNET_KEY
    mp.undo()


@pytest.fixture(scope="module")
def files_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def hist_worker(
    migrated_pg_url: str, integration_redis_url: str, secret_key: str, files_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:  # fmt: skip
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": integration_redis_url,
            "THREADS_AGENTS": AGENTS,
            "THREADS_SECRET_KEY": secret_key,
            "THREADS_FILES_ROOT": str(files_root),
        }
    )
    process = WorkerProcess("hist", env=env, log_path=tmp_path_factory.mktemp("worker") / "hist.log", concurrency=2)
    with process.running():
        yield process


def _settings(pg: str, redis: str, files_root: Path, retention: dict[str, Any] | None = None) -> Any:
    from threads_celery import Settings

    env = {"THREADS_FILES_ROOT": str(files_root)}
    if retention is not None:
        env["THREADS_RETENTION"] = json.dumps(retention)
    return Settings.from_env(env=env, database_url=pg, broker_url=redis)


@pytest.fixture(scope="module")
def client(
    hist_worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str, files_root: Path
) -> Iterator[Any]:
    settings = _settings(migrated_pg_url, integration_redis_url, files_root)
    with registered_client(migrated_pg_url, integration_redis_url, history_agents.ALL_AGENTS, settings=settings) as c:
        yield c


@pytest.fixture(scope="module")
def sql(migrated_pg_url: str) -> Iterator[Any]:
    from threads_celery.store import create_store_engine, parse_database_url

    engine = create_store_engine(parse_database_url(migrated_pg_url))
    yield engine
    engine.dispose()


def _count(sql: Any, table: str, column: str, ids: list[str]) -> int:
    with sql.connect() as conn:
        return int(
            conn.execute(text(f"SELECT count(*) FROM {table} WHERE {column} = ANY(:ids)"), {"ids": ids}).scalar()
        )


def _finished_tools_thread(client: Any, thread_id: str, tenant: str | None = None) -> str:
    handle = client.start(
        "hist_tools", "look it up", thread_id=thread_id,
        env={"API_TOKEN": history_agents.SECRET_VALUE, "CITY": "Lisbon"}, tenant=tenant,
    )  # fmt: skip
    assert client.wait(handle.run_id, timeout=60).status == "completed"
    return handle.thread_id


def _child_threads(sql: Any, thread_id: str) -> list[str]:
    with sql.connect() as conn:
        return list(
            conn.execute(text("SELECT id FROM threads WHERE parent_thread_id = :t"), {"t": thread_id}).scalars()
        )


def test_export_holds_every_row_of_a_thread_and_no_secret(client: Any, sql: Any, tmp_path: Path) -> None:
    thread_id = _finished_tools_thread(client, "hist-export-1")
    target = tmp_path / "out" / "thread.jsonl"
    summary = client.export(str(target), thread_id=thread_id)
    raw = target.read_text()
    lines = [json.loads(line) for line in raw.splitlines()]
    assert lines[0]["record"] == "header" and lines[0]["version"] == 1 and lines[0]["scope"] == {"thread": thread_id}
    assert lines[-1]["record"] == "end" and lines[-1]["threads"] == 1
    exported = client.read_export(str(target))
    assert exported.complete and exported.roots == (thread_id,)
    for kind, table in (("message", "messages"), ("event", "events"), ("run", "runs"), ("tool_call", "tool_calls"),
                        ("usage", "model_usage"), ("variable", "variables")):  # fmt: skip
        assert len(exported.rows(kind)) == _count(sql, table, "thread_id", [thread_id]) > 0, kind
    call = exported.rows("tool_call")[0]
    assert call["tool"] == "lookup" and call["status"] == "completed" and call["effect"] == "read_only"
    assert "Lisbon" in call["result"]
    # Every column of the row is there, as the table has them.
    with sql.connect() as conn:
        columns = set(conn.execute(text("SELECT * FROM messages LIMIT 0")).keys())
    assert set(exported.rows("message")[0]) == columns
    secret = next(v for v in exported.rows("variable") if v["name"] == "API_TOKEN")
    assert secret["value"] is None and secret["value_redacted"] is True
    with sql.connect() as conn:
        ciphertext = conn.execute(
            text("SELECT value FROM variables WHERE thread_id = :t AND name = 'API_TOKEN'"), {"t": thread_id}
        ).scalar()
    assert ciphertext and ciphertext not in raw and history_agents.SECRET_VALUE not in raw
    assert summary.rows["message"] == len(exported.rows("message"))


def test_export_and_erase_refuse_a_running_thread_and_change_nothing(client: Any, sql: Any, tmp_path: Path) -> None:
    from threads_celery.exceptions import HistoryRefused

    handle = client.start("hist_asks", "send it", thread_id="hist-running-1")
    run = client.wait(handle.run_id, timeout=60)
    assert run.status == "awaiting_approval"
    target = tmp_path / "never.jsonl"
    with pytest.raises(HistoryRefused, match=r"is running: run .* has not finished"):
        client.export(str(target), thread_id=handle.thread_id)
    assert not target.exists()
    before = {t: _count(sql, t, "thread_id", [handle.thread_id]) for t in TABLES_BY_THREAD}
    with pytest.raises(HistoryRefused, match="not erased: thread hist-running-1 is running"):
        client.erase(thread_id=handle.thread_id)
    assert {t: _count(sql, t, "thread_id", [handle.thread_id]) for t in TABLES_BY_THREAD} == before
    # The run goes on as if nothing was asked.
    pending = [p for p in client.parked() if p.run_id == handle.run_id]
    assert len(pending) == 1
    client.approve(pending[0].effect_key, principal="tester")
    assert client.wait(handle.run_id, timeout=60).status == "completed"


def test_erase_removes_a_thread_its_children_files_and_secrets_and_reports_it(
    client: Any, sql: Any, files_root: Path
) -> None:
    handle = client.start("hist_parent", "ask", thread_id="hist-erase-1")
    assert client.wait(handle.run_id, timeout=60).status == "completed"
    children = _child_threads(sql, handle.thread_id)
    assert len(children) == 1
    other = _finished_tools_thread(client, "hist-erase-keep")
    secret_thread = _finished_tools_thread(client, "hist-erase-secret")
    area = files_root / handle.thread_id
    (area / "notes").mkdir(parents=True)
    (area / "notes" / "a.txt").write_text("attachment")
    ids = [handle.thread_id, *children]
    before = {t: _count(sql, t, "thread_id", ids) for t in TABLES_BY_THREAD}
    # Doorbells a crash could have left: the run's next step and the child run's delivery.
    with sql.begin() as conn:
        step = conn.execute(text("SELECT step FROM runs WHERE id = :r"), {"r": handle.run_id}).scalar()
        tool_run = conn.execute(
            text("SELECT run_id FROM agent_tool_runs WHERE parent_thread_id = :t"), {"t": handle.thread_id}
        ).scalar()
        for key in (f"step:{handle.run_id}:{step}", f"deliver:{tool_run}:completed"):
            conn.execute(
                text("INSERT INTO outbox (key, task, args, created_at, due_at, publish_count) "
                     "VALUES (:k, 'threads.step', '[]', now(), now() + interval '1 hour', 0)"),
                {"k": key},
            )  # fmt: skip

    report = client.erase(thread_id=handle.thread_id)

    assert set(report.threads) == set(ids) and report.complete and report.files == 1
    assert report.rows["threads"] == 2
    for table in ("messages", "events", "runs", "tool_calls", "model_usage"):
        assert report.rows[table] == before[table] > 0, table
    assert report.rows["agent_tool_runs"] == 1 and report.rows["outbox"] == 2
    assert all(_count(sql, t, "thread_id", ids) == 0 for t in TABLES_BY_THREAD)
    assert _count(sql, "threads", "id", ids) == 0
    assert _count(sql, "agent_tool_runs", "parent_thread_id", ids) == 0
    assert not area.exists()
    assert _count(sql, "messages", "thread_id", [other]) > 0  # another thread is untouched
    json.dumps(report.as_dict())  # the audit record is plain JSON

    secret_report = client.erase(thread_id=secret_thread)
    assert secret_report.rows["variables"] == 2
    with sql.connect() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM variables WHERE thread_id = :t"), {"t": secret_thread}).scalar()
            == 0
        )


def test_erase_of_a_tenant_erases_the_finished_and_lists_the_running(client: Any, sql: Any) -> None:
    done = [_finished_tools_thread(client, f"hist-tenant-{i}", tenant="acme") for i in range(3)]
    waiting = client.start("hist_asks", "send it", thread_id="hist-tenant-run", tenant="acme")
    assert client.wait(waiting.run_id, timeout=60).status == "awaiting_approval"
    mine = _finished_tools_thread(client, "hist-tenant-other", tenant="globex")

    report = client.erase(tenant="acme")

    assert set(report.threads) == set(done)
    assert [t for t, _ in report.refused] == [waiting.thread_id] and "is running" in report.refused[0][1]
    assert not report.complete
    assert _count(sql, "threads", "id", done) == 0
    assert _count(sql, "threads", "id", [waiting.thread_id, mine]) == 2


def test_prune_dry_run_hold_archive_read_back_and_a_second_sweep(
    hist_worker: WorkerProcess, migrated_pg_url: str, integration_redis_url: str, files_root: Path, sql: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    archive = tmp_path / "archive"
    retention = {
        "rules": [{"status": "succeeded", "keep_days": 7}, {"status": "failed", "keep_days": 30}],
        "action": "archive", "archive_url": str(archive), "batch_size": 2,
    }  # fmt: skip
    settings = _settings(migrated_pg_url, integration_redis_url, files_root, retention)
    with registered_client(migrated_pg_url, integration_redis_url, history_agents.ALL_AGENTS, settings=settings) as c:
        old = [_finished_tools_thread(c, f"hist-prune-{i}") for i in range(3)]
        held = _finished_tools_thread(c, "hist-prune-held")
        c.hold(held, reason="support case 12", held_by="dpo@example.com")
        waiting = c.start("hist_asks", "send it", thread_id="hist-prune-waiting")
        assert c.wait(waiting.run_id, timeout=60).status == "awaiting_approval"
        exported = tmp_path / "before.jsonl"
        c.export(str(exported), thread_id=old[0])
        before = c.read_export(str(exported))

        soon = datetime.now(UTC) + timedelta(days=1)
        assert c.prune(dry_run=True, now=soon).due == 0  # succeeded threads keep 7 days

        later = datetime.now(UTC) + timedelta(days=8)
        dry = c.prune(dry_run=True, now=later)
        assert dry.dry_run and dry.pruned == []
        kept = {k.thread_id: k.reason for k in dry.kept}
        assert "is held" in kept[held] and "is running" in kept[waiting.thread_id]
        due_ids = set(old)
        assert dry.due >= len(due_ids) and _count(sql, "threads", "id", old) == 3

        swept = c.prune(dry_run=False, now=later)
        assert due_ids <= set(swept.pruned) and held not in swept.pruned and waiting.thread_id not in swept.pruned
        assert swept.batches >= 2  # batch_size 2: bounded batches, each its own transaction
        assert _count(sql, "threads", "id", old) == 0
        assert _count(sql, "threads", "id", [held, waiting.thread_id]) == 2

        back = c.read_archive(old[0])
        assert back.complete
        assert back.records == before.records  # the same rows, column for column
        assert back.header["version"] == before.header["version"] == 1

        again = c.prune(dry_run=False, now=later)
        assert again.pruned == [] and sum(again.rows.values()) == 0
        assert c.release_hold(held) is True
        assert held in c.prune(dry_run=False, now=later).pruned


def _cli(pg: str, *args: str, retention: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    extra = {"THREADS_DATABASE_URL": pg, "THREADS_SECRET_KEY": history_agents.FERNET_KEY}
    if retention is not None:
        extra["THREADS_RETENTION"] = json.dumps(retention)
    return subprocess.run(
        [THREADS_CELERY, "history", *args], env=subprocess_env(extra), capture_output=True, text=True, timeout=120
    )


def test_the_cli_exports_holds_prunes_and_erases(client: Any, migrated_pg_url: str, sql: Any, tmp_path: Path) -> None:
    thread_id = _finished_tools_thread(client, "hist-cli-1")
    target = tmp_path / "cli.jsonl"
    done = _cli(migrated_pg_url, "export", "--thread", thread_id, "--to", str(target))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["threads"] == 1
    assert client.read_export(str(target)).roots == (thread_id,)

    held = _cli(migrated_pg_url, "hold", thread_id, "--reason", "case 7", "--principal", "dpo")
    assert held.returncode == 0, held.stderr
    listed = _cli(migrated_pg_url, "holds", "--json")
    assert [h["thread"] for h in json.loads(listed.stdout) if h["thread"] == thread_id] == [thread_id]

    policy = {"rules": [{"status": "succeeded", "keep_days": 0}]}
    dry = _cli(migrated_pg_url, "prune", "--dry-run", "--json", retention=policy)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True and json.loads(dry.stdout)["pruned"] == []
    assert _count(sql, "threads", "id", [thread_id]) == 1

    refused = _cli(migrated_pg_url, "erase", "--thread", thread_id, "--yes")
    assert refused.returncode == 2 and "is held" in refused.stderr
    assert _cli(migrated_pg_url, "release", thread_id).returncode == 0
    erased = _cli(migrated_pg_url, "erase", "--thread", thread_id, "--yes")
    assert erased.returncode == 0, erased.stderr
    report = json.loads(erased.stdout)
    assert report["threads"] == [thread_id] and report["rows"]["messages"] > 0 and report["refused"] == []
    assert _count(sql, "threads", "id", [thread_id]) == 0

    waiting = client.start("hist_asks", "send it", thread_id="hist-cli-waiting")
    assert client.wait(waiting.run_id, timeout=60).status == "awaiting_approval"
    busy = _cli(migrated_pg_url, "erase", "--thread", waiting.thread_id, "--yes")
    assert busy.returncode == 2 and "is running" in busy.stderr and "Traceback" not in busy.stderr
    bad = _cli(migrated_pg_url, "export", "--since", "yesterday", "--to", str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


@pytest.fixture
def s3_endpoint() -> Iterator[dict[str, Any]]:
    """A real S3 endpoint (moto's server mode) on a free port, with a bucket ``history``."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tests.support.processes import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {
        "endpoint_url": f"http://127.0.0.1:{port}", "key": "testing", "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"}, "skip_instance_cache": True,
    }  # fmt: skip
    try:
        boto3.client(
            "s3", endpoint_url=options["endpoint_url"], aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
        ).create_bucket(Bucket="history")  # fmt: skip
        yield options
    finally:
        server.stop()


def test_export_and_archive_to_s3_read_back_identical(
    client: Any, migrated_pg_url: str, integration_redis_url: str, files_root: Path, sql: Any,
    s3_endpoint: dict[str, Any], tmp_path: Path,
) -> None:  # fmt: skip
    import fsspec

    thread_id = _finished_tools_thread(client, "hist-s3-1")
    summary = client.export("s3://history/exports/one.jsonl", thread_id=thread_id, storage_options=s3_endpoint)
    assert summary.threads == (thread_id,)
    s3 = fsspec.filesystem("s3", **s3_endpoint)
    assert s3.exists("history/exports/one.jsonl")
    exported = client.read_export("s3://history/exports/one.jsonl", storage_options=s3_endpoint)
    local = tmp_path / "one.jsonl"
    client.export(str(local), thread_id=thread_id)
    assert exported.records == client.read_export(str(local)).records

    retention = {
        "rules": [{"status": "succeeded", "keep_days": 0}], "action": "archive",
        "archive_url": "s3://history/archive", "archive_options": s3_endpoint,
    }  # fmt: skip
    settings = _settings(migrated_pg_url, integration_redis_url, files_root, retention)
    with registered_client(migrated_pg_url, integration_redis_url, history_agents.ALL_AGENTS, settings=settings) as c:
        swept = c.prune(dry_run=False)
        assert thread_id in swept.pruned
        assert "s3://history/archive/default/hist-s3-1.jsonl" in swept.archived
        assert _count(sql, "threads", "id", [thread_id]) == 0
        back = c.read_archive(thread_id)
    assert back.complete and back.records == exported.records


def test_old_events_go_in_batches_and_newer_ones_and_messages_stay(
    client: Any, migrated_pg_url: str, integration_redis_url: str, files_root: Path, sql: Any
) -> None:
    older = _finished_tools_thread(client, "hist-events-old")
    cutoff = datetime.now(UTC)
    newer = _finished_tools_thread(client, "hist-events-new")
    kept_events = _count(sql, "events", "thread_id", [newer])
    messages = _count(sql, "messages", "thread_id", [older, newer])
    assert _count(sql, "events", "thread_id", [older]) > 0 and kept_events > 0
    policy = {"events_keep_days": 1, "events_batch_size": 3}
    settings = _settings(migrated_pg_url, integration_redis_url, files_root, policy)
    with registered_client(migrated_pg_url, integration_redis_url, history_agents.ALL_AGENTS, settings=settings) as c:
        dry = c.prune(dry_run=True, now=cutoff + timedelta(days=1))
        assert dry.events == 0 and dry.events_through is not None
        assert _count(sql, "events", "thread_id", [older]) > 0
        done = c.prune(dry_run=False, now=cutoff + timedelta(days=1))
        assert done.events >= 4  # more than one batch of 3
        assert _count(sql, "events", "thread_id", [older]) == 0
        assert _count(sql, "events", "thread_id", [newer]) == kept_events
        assert _count(sql, "messages", "thread_id", [older, newer]) == messages
        assert c.prune(dry_run=False, now=cutoff + timedelta(days=1)).events == 0
        # A replay of a thread whose old events are gone is empty, not an error; its messages stay.
        assert list(c.events(older, after=0)) == []
        assert len(c.messages(older)) > 0
