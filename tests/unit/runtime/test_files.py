"""Per-thread attachments: ``ThreadFiles``, the copies across thread boundaries, and ``ctx.files``.

Every escape attempt is checked twice: the call raises ``AttachmentPathError``, and nothing on
disk changed (neither the area nor the folder the name pointed at).
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from threads_celery import Agent, Settings, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.definitions.context import ToolContext
from threads_celery.exceptions import AttachmentPathError
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.workspace.files import (
    ThreadFiles,
    area_name,
    copy_back_to_parent,
    copy_into_child,
)

WAIT_S = 30.0
_names = itertools.count()


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file contents, symlink targets, folders."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[key] = "-> " + str(path.readlink())
        elif path.is_dir():
            out[key] = "dir"
        else:
            out[key] = path.read_bytes()
    return out


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, ThreadFiles, Path]:
    """A files root with one thread's area (a file, a folder, symlinks in and out) and a secret outside it."""
    root = tmp_path / "files"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    files = ThreadFiles(root, "thr_1")
    files.write_text("notes.txt", "mine")
    files.write_text("docs/readme.md", "hello")
    (files.directory / "out").symlink_to(outside)
    (files.directory / "out-file").symlink_to(outside / "secret.txt")
    (files.directory / "in").symlink_to(files.directory / "docs")
    return tmp_path, files, outside


# -- reading and writing -------------------------------------------------------------------------


def test_writing_and_reading(tmp_path: Path) -> None:
    files = ThreadFiles(tmp_path / "files", "thr_a")
    assert not (tmp_path / "files").exists()  # nothing is created before the first write
    assert files.list() == []
    assert files.write_text("report.md", "# Report\n") == "report.md"
    assert files.write_bytes("./data//rows.bin", b"\x00\x01") == "data/rows.bin"
    assert files.read_text("report.md") == "# Report\n"
    assert files.read_bytes("data/rows.bin") == b"\x00\x01"
    assert files.exists("report.md") and not files.exists("missing.txt")
    assert files.list() == ["data/rows.bin", "report.md"]
    assert (tmp_path / "files" / "thr_a" / "report.md").read_text() == "# Report\n"
    assert files.path("data/rows.bin") == (tmp_path / "files" / "thr_a" / "data" / "rows.bin").resolve()
    files.write_text("report.md", "v2")
    assert files.read_text("report.md") == "v2"
    assert files.delete("report.md") is True and files.delete("report.md") is False
    with pytest.raises(FileNotFoundError, match=r"no attachment 'report\.md'"):
        files.read_text("report.md")


def test_each_thread_has_its_own_area(tmp_path: Path) -> None:
    a, b = ThreadFiles(tmp_path, "thr_a"), ThreadFiles(tmp_path, "thr_b")
    a.write_text("x.txt", "from a")
    assert not b.exists("x.txt")
    assert b.list() == []


@pytest.mark.parametrize("thread_id", ["../evil", "a/b", "..", "", "x" * 300, "thr\x00"])
def test_an_unsafe_thread_id_still_gets_an_area_inside_the_root(tmp_path: Path, thread_id: str) -> None:
    files = ThreadFiles(tmp_path / "files", thread_id)
    files.write_text("a.txt", "ok")
    assert files.directory.parent == tmp_path / "files"
    assert files.directory.name == area_name(thread_id) and files.directory.name.startswith("_")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files"]


def test_a_symlink_that_stays_inside_the_area_is_followed(world: tuple[Path, ThreadFiles, Path]) -> None:
    _, files, _ = world
    assert files.read_text("in/readme.md") == "hello"
    assert files.list() == ["docs/readme.md", "notes.txt"]  # "out", "out-file" lead outside


# -- escapes ----------------------------------------------------------------------------------------

ESCAPES = [
    "../x",
    "/etc/passwd",
    "a/../../x",
    "..",
    "docs/../../notes.txt",
    "out/secret.txt",
    "out-file",
    "out/new.txt",
    "nul\x00byte.txt",
    "..\\x",
    "",
    ".",
    "./",
]
ATTEMPTS: dict[str, Callable[[ThreadFiles, str], Any]] = {
    "path": lambda f, name: f.path(name),
    "read_text": lambda f, name: f.read_text(name),
    "read_bytes": lambda f, name: f.read_bytes(name),
    "exists": lambda f, name: f.exists(name),
    "write_text": lambda f, name: f.write_text(name, "overwritten"),
    "write_bytes": lambda f, name: f.write_bytes(name, b"overwritten"),
    "delete": lambda f, name: f.delete(name),
    "copy from": lambda f, name: f.copy_to(ThreadFiles(f.root, "thr_other"), name),
    # Into the same area, the one that holds the symlinks.
    "copy to": lambda f, name: f.copy_to(f, "notes.txt", dest_name=name),
}


@pytest.mark.parametrize("name", ESCAPES)
@pytest.mark.parametrize("attempt", list(ATTEMPTS))
def test_every_escape_is_refused_and_changes_nothing(
    world: tuple[Path, ThreadFiles, Path], name: str, attempt: str
) -> None:
    tmp_path, files, _ = world
    before = snapshot(tmp_path)
    with pytest.raises(AttachmentPathError):
        ATTEMPTS[attempt](files, name)
    assert snapshot(tmp_path) == before


def test_an_area_that_is_itself_a_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "thr_x").symlink_to(elsewhere)
    with pytest.raises(AttachmentPathError, match="is a symlink"):
        ThreadFiles(tmp_path / "files", "thr_x").write_text("a.txt", "x")
    assert list(elsewhere.iterdir()) == []


def test_the_error_is_clear_and_survives_pickling() -> None:
    with pytest.raises(AttachmentPathError) as caught:
        ThreadFiles("/tmp/unused", "thr").path("../x")
    error = caught.value
    assert isinstance(error, ValueError)
    assert str(error) == "attachment name '../x' is refused: it climbs out with '..'"
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.name, again.reason, str(again)) == (
        AttachmentPathError,
        "../x",
        error.reason,
        str(error),
    )


# -- across threads ---------------------------------------------------------------------------------


def test_parent_to_child_copies_resolve_in_the_child(tmp_path: Path) -> None:
    parent, child = ThreadFiles(tmp_path, "thr_parent"), ThreadFiles(tmp_path, "thr_child")
    parent.write_text("brief.md", "do the thing")
    parent.write_bytes("data/input.csv", b"a,b\n1,2\n")
    refs = copy_into_child(parent, child, ["brief.md", "data/input.csv"])
    assert refs == ["brief.md", "data/input.csv"]
    for ref, original in zip(refs, ["brief.md", "data/input.csv"], strict=True):
        assert child.path(ref).is_relative_to(child.directory.resolve())
        assert child.read_bytes(ref) == parent.read_bytes(original)
    child.write_text("brief.md", "the child's own edit")
    assert parent.read_text("brief.md") == "do the thing"  # a copy, not a shared file


def test_child_to_parent_copies_resolve_in_the_parent_and_never_overwrite(tmp_path: Path) -> None:
    parent, child = ThreadFiles(tmp_path, "thr_parent"), ThreadFiles(tmp_path, "thr_child")
    parent.write_text("report.md", "the parent's own report")
    child.write_text("report.md", "the child's findings")
    child.write_text("out/chart.svg", "<svg/>")
    refs = copy_back_to_parent(child, parent, ["report.md", "out/chart.svg"])
    assert refs == ["report-2.md", "out/chart.svg"]
    assert parent.read_text("report-2.md") == "the child's findings"
    assert parent.read_text("out/chart.svg") == "<svg/>"
    assert parent.read_text("report.md") == "the parent's own report"
    # Handing the same files back again (a retried hand-off) reuses the copies.
    assert copy_back_to_parent(child, parent, ["report.md", "out/chart.svg"]) == refs
    assert parent.list() == ["out/chart.svg", "report-2.md", "report.md"]


def test_copy_to_a_chosen_name(tmp_path: Path) -> None:
    a, b = ThreadFiles(tmp_path, "thr_a"), ThreadFiles(tmp_path, "thr_b")
    a.write_text("archive.tar.gz", "bytes")
    b.write_text("in/archive.tar.gz", "other bytes")
    assert a.copy_to(b, "archive.tar.gz", dest_name="in/archive.tar.gz") == "in/archive-2.tar.gz"
    assert b.read_text("in/archive-2.tar.gz") == "bytes"


def test_a_missing_name_copies_nothing(tmp_path: Path) -> None:
    parent, child = ThreadFiles(tmp_path, "thr_parent"), ThreadFiles(tmp_path, "thr_child")
    parent.write_text("a.txt", "a")
    with pytest.raises(FileNotFoundError, match=r"no attachment 'missing\.txt'"):
        copy_into_child(parent, child, ["a.txt", "missing.txt"])
    assert child.list() == []
    with pytest.raises(AttachmentPathError):
        copy_into_child(parent, child, ["a.txt", "../thr_parent/a.txt"])
    assert child.list() == []


# -- ctx.files ----------------------------------------------------------------------------------------


def test_ctx_files_is_the_threads_area_under_the_configured_root(tmp_path: Path) -> None:
    ctx = ToolContext(
        effect_key="k", run_id="r", thread_id="thr_9", attempt=1, settings=Settings(files_root=str(tmp_path))
    )
    assert ctx.files.directory == tmp_path / "thr_9"
    assert ctx.files is ctx.files


def test_files_root_comes_from_the_environment() -> None:
    assert Settings.from_env(env={}).files_root == ".threads-celery/files"
    assert Settings.from_env(env={"THREADS_FILES_ROOT": "/srv/files"}).files_root == "/srv/files"


class Note(BaseModel):
    name: str
    text: str = ""


@pytest.fixture(scope="module")
def files_root(threads: Threads) -> Path:
    """The module's runtime keeps thread files in a temporary folder of its own."""
    return Path(threads.settings.files_root)


def last_user_text(messages: list[Any]) -> str:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    texts = [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]
    return texts[-1]


def test_a_file_a_tool_writes_is_read_by_a_later_tool_of_the_same_thread(threads: Threads, files_root: Path) -> None:
    save = tool(
        name="save_note",
        description="Save a note.",
        input=Note,
        execute=lambda inp, ctx: ctx.files.write_text(inp.name, inp.text),
    )
    load = tool(
        name="load_note",
        description="Read a note.",
        input=Note,
        effect="read_only",
        execute=lambda inp, ctx: ctx.files.read_text(inp.name),
    )
    note = "notes/today.md"

    # "remember ...": save, then read back in the same run; anything else: only read.
    def first_turn(messages: list[Any]) -> Any:
        if "remember" in last_user_text(messages):
            return call("save_note", name=note, text="buy milk")
        return call("load_note", name=note)

    def second_turn(messages: list[Any]) -> Any:
        return call("load_note", name=note) if "remember" in last_user_text(messages) else say("read")

    agent = Agent(
        name=f"notes_{next(_names)}",
        instructions="Take notes.",
        model=ScriptedModel([first_turn, second_turn, say("noted")]),
        tools=[save, load],
        permissions=Permissions.allow_all(),
    )

    def results(thread_id: str) -> list[tuple[str, str, bool]]:
        return [
            (m.tool_result.name, m.tool_result.content, m.tool_result.is_error)
            for m in threads.messages(thread_id)
            if m.tool_result is not None
        ]

    first = threads.start(agent, "remember to buy milk")
    assert threads.wait(first.run_id, timeout=WAIT_S).status == "completed"
    assert results(first.thread_id) == [("save_note", note, False), ("load_note", "buy milk", False)]
    assert (files_root / area_name(first.thread_id) / "notes" / "today.md").read_text() == "buy milk"

    # A later run of the same thread still has the file; another thread does not.
    again = threads.start(agent, "what did I note?", thread_id=first.thread_id)
    assert threads.wait(again.run_id, timeout=WAIT_S).status == "completed"
    assert results(first.thread_id)[-1] == ("load_note", "buy milk", False)

    other = threads.start(agent, "what did I note?")
    assert threads.wait(other.run_id, timeout=WAIT_S).status == "completed"
    name, content, is_error = results(other.thread_id)[-1]
    assert (name, is_error) == ("load_note", True)
    assert "FileNotFoundError" in content
