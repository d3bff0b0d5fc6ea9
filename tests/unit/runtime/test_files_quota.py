"""``ctx.files`` quotas: a thread's files have a size and a file-count limit, and a write past
either is a clear tool error that writes nothing and leaves the earlier files intact."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel

from threads_celery import Agent, ConfigError, Settings, Threads, tool
from threads_celery.definitions.context import ToolContext
from threads_celery.exceptions import AttachmentQuotaError
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.workspace.files import FilesQuota, ThreadFiles, quota_breach


def test_quota_breach_is_a_pure_decision() -> None:
    quota = FilesQuota(max_bytes=100, max_files=2)
    assert quota_breach(quota, used_bytes=60, files=1, replaced_bytes=None, new_bytes=40) is None
    assert "101 bytes, over the limit of 100" in (
        quota_breach(quota, used_bytes=60, files=1, replaced_bytes=None, new_bytes=41) or ""
    )
    # Overwriting a file counts only the difference.
    assert quota_breach(quota, used_bytes=90, files=2, replaced_bytes=80, new_bytes=90) is None
    assert "THREADS_FILES_MAX_COUNT" in (
        quota_breach(quota, used_bytes=0, files=2, replaced_bytes=None, new_bytes=0) or ""
    )
    assert quota_breach(FilesQuota(), used_bytes=10**12, files=10**6, replaced_bytes=None, new_bytes=10**9) is None


def test_a_write_past_the_size_limit_writes_nothing_and_keeps_earlier_files(tmp_path: Path) -> None:
    files = ThreadFiles(tmp_path, "t1", quota=FilesQuota(max_bytes=1000))
    files.write_bytes("a.bin", b"a" * 600)
    files.write_text("notes.txt", "keep me")
    with pytest.raises(AttachmentQuotaError, match="over the limit of 1,000") as caught:
        files.write_bytes("b.bin", b"b" * 500)
    assert "earlier files are intact" in str(caught.value)
    with pytest.raises(AttachmentQuotaError):
        files.write_bytes("a.bin", b"a" * 1001)  # a replacement past the limit keeps the old content
    assert files.list() == ["a.bin", "notes.txt"]
    assert files.read_bytes("a.bin") == b"a" * 600 and files.read_text("notes.txt") == "keep me"
    assert [
        p.name
        for p in files.directory.iterdir()
        if p.name.startswith(".threads-tmp-") and p.name != ".threads-tmp-lock"
    ] == []
    files.write_bytes("a.bin", b"a" * 900)  # replacing within the limit is fine
    assert files.usage() == (907, 2)


def test_a_write_past_the_file_count_writes_nothing(tmp_path: Path) -> None:
    files = ThreadFiles(tmp_path, "t2", quota=FilesQuota(max_files=2))
    files.write_text("one", "1")
    files.write_text("dir/two", "2")
    with pytest.raises(AttachmentQuotaError, match="2 files"):
        files.write_text("three", "3")
    files.write_text("one", "overwrite is not a new file")
    assert files.list() == ["dir/two", "one"]


def test_copies_into_another_thread_count_against_the_receivers_quota(tmp_path: Path) -> None:
    source = ThreadFiles(tmp_path, "parent")
    source.write_bytes("big.bin", b"x" * 2000)
    child = ThreadFiles(tmp_path, "child", quota=FilesQuota(max_bytes=1000))
    with pytest.raises(AttachmentQuotaError):
        source.copy_to(child, "big.bin")
    assert child.list() == []


def test_concurrent_writers_cannot_both_squeeze_under_the_limit(tmp_path: Path) -> None:
    quota = FilesQuota(max_bytes=1000)
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def writer(n: int) -> None:
        files = ThreadFiles(tmp_path, "shared", quota=quota)  # each call has its own handle
        barrier.wait()
        try:
            files.write_bytes(f"part-{n}.bin", b"z" * 400)
            outcomes.append("ok")
        except AttachmentQuotaError:
            outcomes.append("refused")

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert outcomes.count("ok") == 2 and outcomes.count("refused") == 6
    assert ThreadFiles(tmp_path, "shared").usage() == (800, 2)


def test_the_error_survives_a_task_boundary() -> None:
    error = AttachmentQuotaError("t", "over the limit")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy)) == (AttachmentQuotaError, str(error))


def test_quotas_come_from_the_settings_and_bad_values_are_refused(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"THREADS_FILES_MAX_BYTES": "2048", "THREADS_FILES_MAX_COUNT": "3", "THREADS_FILES_ROOT": str(tmp_path)}
    )
    assert (settings.files_max_bytes, settings.files_max_count) == (2048, 3)
    ctx = ToolContext(effect_key="k", run_id="r", thread_id="t", attempt=1, settings=settings)
    assert ctx.files.quota == FilesQuota(2048, 3)
    unlimited = ToolContext(
        effect_key="k",
        run_id="r",
        thread_id="t",
        attempt=1,
        settings=Settings(files_max_bytes=0, files_max_count=0, files_root=str(tmp_path)),
    )
    assert unlimited.files.quota == FilesQuota(None, None)
    assert Settings().files_max_bytes == 100 * 2**20 and Settings().files_max_count == 1000  # on by default
    with pytest.raises(ConfigError, match="files_max_bytes"):
        Settings(files_max_bytes=-1)


class Save(BaseModel):
    name: str
    size: int


def _save(inp: Save, ctx: ToolContext) -> str:
    return ctx.files.write_bytes(inp.name, b"d" * inp.size)


save = tool(name="save", description="Save a file.", input=Save, effect="read_only", execute=_save)


def test_a_tool_that_overruns_the_quota_gets_a_clear_error_and_the_thread_keeps_its_files(tmp_path: Path) -> None:
    settings = Settings(files_root=str(tmp_path / "files"), files_max_bytes=1000, files_max_count=10)
    agent = Agent(
        name="saver",
        instructions="x",
        model=ScriptedModel(
            [call("save", name="first.bin", size=600), call("save", name="second.bin", size=50 * 2**20), say("done")]
        ),
        tools=[save],
    )
    with Threads.embedded(settings=settings) as threads:
        run = threads.wait(threads.start(agent, "go").run_id, 30)
        assert run.status == "completed", run.error
        results = [m.tool_result for m in threads.messages(run.thread_id) if m.role == "tool" and m.tool_result]
    assert [(r.is_error, r.content.split(":")[0]) for r in results] == [
        (False, "first.bin"),
        (True, "AttachmentQuotaError"),
    ]
    assert "THREADS_FILES_MAX_BYTES" in results[1].content
    files = ThreadFiles(settings.files_root, run.thread_id)
    assert files.list() == ["first.bin"] and files.read_bytes("first.bin") == b"d" * 600
