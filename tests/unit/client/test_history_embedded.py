"""Export, erasure and retention on the embedded store (SQLite), and their refusals.

The same queries as on PostgreSQL (``tests/integration/test_history_pg.py`` runs them there with
a real worker); here a run is driven by the embedded worker, and the ledger states that a real
run reaches only through a crash (an aborted run whose unguarded call was still started) are
written as rows.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, update

from threads_celery import Agent, Threads
from threads_celery.exceptions import ConfigError, HistoryFormatError, HistoryRefused
from threads_celery.store.schema import runs, tool_calls
from threads_celery.testing import ScriptedModel, say

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _agent() -> Agent:
    return Agent(name="hist_embedded", instructions="Answer.", model=ScriptedModel([say("hello there")] * 10))


def test_export_and_erase_on_sqlite(tmp_path: Path) -> None:
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        agent = _agent()
        done = [threads.start(agent, "hi", thread_id=f"emb-{i}") for i in range(3)]
        for handle in done:
            assert threads.wait(handle.run_id, timeout=30).status == "completed"
        stream = io.StringIO()
        summary = threads.export(stream, since=datetime.now(UTC) - timedelta(hours=1))
        assert set(summary.threads) == {"emb-0", "emb-1", "emb-2"}
        target = tmp_path / "all.jsonl"
        target.write_text(stream.getvalue())
        back = threads.read_export(str(target))
        assert back.complete and back.header["scope"]["since"]
        assert [m["text"] for m in back.rows("message", root="emb-1")] == ["hi", "hello there"]
        assert threads.export(io.StringIO(), until=datetime.now(UTC) - timedelta(hours=1)).threads == ()

        report = threads.erase(thread_id="emb-1")
        assert report.threads == ("emb-1",) and report.rows["messages"] == 2 and report.rows["runs"] == 1
        with threads.store.read() as tx:
            assert tx.get_thread("emb-1") is None
        assert threads.messages("emb-0")  # the others stay


def test_a_finished_run_with_an_unguarded_call_still_started_is_refused(tmp_path: Path) -> None:
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        with threads.store.transaction() as tx:
            tx.insert_thread("t_crash", "a", "h", T0)
            tx.insert_run("run_crash", "t_crash", "a", "go", T0)
            tx.conn.execute(update(runs).where(runs.c.id == "run_crash").values(status="aborted", finished_at=T0))
            tx.conn.execute(
                insert(tool_calls).values(
                    effect_key="run_crash:0:0", run_id="run_crash", thread_id="t_crash", step=0, idx=0,
                    calls_in_step=1, call_id="c", tool="pay", args="{}", args_hash="h", effect="unguarded",
                    status="started", attempt=1, is_error=False, created_at=T0,
                )
            )  # fmt: skip
        with pytest.raises(
            HistoryRefused, match=r"unguarded or reconcilable call without an outcome \(run_crash:0:0\)"
        ):
            threads.export(io.StringIO(), thread_id="t_crash")
        with pytest.raises(HistoryRefused, match="not erased"):
            threads.erase(thread_id="t_crash")
        report = threads.erase(tenant="default")
        assert report.threads == () and [t for t, _ in report.refused] == ["t_crash"]
        # A call that never began (still pending when its run ended) does not keep the thread.
        with threads.store.transaction() as tx:
            tx.conn.execute(update(tool_calls).values(status="pending"))
        assert threads.export(io.StringIO(), thread_id="t_crash").threads == ("t_crash",)
        # Parked (it may have happened): kept until a person settles it, then the thread can go.
        with threads.store.transaction() as tx:
            tx.conn.execute(update(tool_calls).values(status="parked"))
        with pytest.raises(HistoryRefused, match="without an outcome"):
            threads.erase(thread_id="t_crash")
        with threads.store.transaction() as tx:
            tx.conn.execute(update(tool_calls).values(status="completed", resolution="assume_done"))
        assert threads.erase(thread_id="t_crash").threads == ("t_crash",)


def test_holds_and_bad_input(tmp_path: Path) -> None:
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None) as threads:
        with pytest.raises(ConfigError, match="give a thread, a tenant or a time range"):
            threads.export(io.StringIO())
        with pytest.raises(ConfigError, match="not both"):
            threads.erase(thread_id="x", tenant="y")
        with pytest.raises(ConfigError, match="aware datetime"):
            threads.export(io.StringIO(), since=datetime(2026, 1, 1))
        with pytest.raises(LookupError):
            threads.hold("nope", reason="r", held_by="me")
        with pytest.raises(ConfigError, match="needs a reason"):
            threads.hold("nope", reason=" ", held_by="me")
        assert threads.release_hold("nope") is False
        bad = tmp_path / "bad.jsonl"
        for text, message in (
            ("", "is empty"),
            ('{"record": "header", "format": "threads-celery/history", "version": 9}\n', "format version 9"),
            ("not json\n", "not JSON"),
            ('{"record": "message"}\n', "not a threads-celery/history header"),
        ):
            bad.write_text(text)
            with pytest.raises(HistoryFormatError, match=message):
                threads.read_export(str(bad))
        with pytest.raises(HistoryFormatError, match="no such export"):
            threads.read_export(str(tmp_path / "missing.jsonl"))


def test_prune_on_sqlite_walks_batches_of_one_and_removes_files(tmp_path: Path) -> None:
    from threads_celery import Settings

    files = tmp_path / "files"
    settings = Settings.from_env(
        env={
            "THREADS_RETENTION": '{"rules": [{"status": "succeeded", "keep_days": 1}], "batch_size": 1}',
            "THREADS_FILES_ROOT": str(files),
        }
    )
    with Threads.embedded(tmp_path / "e.db", reconcile_interval=None, settings=settings) as threads:
        agent = _agent()
        for i in range(3):
            handle = threads.start(agent, "hi", thread_id=f"old-{i}")
            assert threads.wait(handle.run_id, timeout=30).status == "completed"
        (files / "old-1").mkdir(parents=True)
        (files / "old-1" / "a.txt").write_text("x")
        threads.hold("old-2", reason="kept", held_by="me")
        assert threads.prune(dry_run=False).pruned == []  # a day is not over
        swept = threads.prune(dry_run=False, now=datetime.now(UTC) + timedelta(days=2))
        assert sorted(swept.pruned) == ["old-0", "old-1"] and swept.batches == 4 and swept.rows["files"] == 1
        assert not (files / "old-1").exists()
        assert [h.thread_id for h in threads.holds()] == ["old-2"]
