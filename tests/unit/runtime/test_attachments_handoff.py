"""Attachments cross thread boundaries by copy: references are valid in the receiving thread."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from threads_celery import Agent, Permissions, Prompt, Threads, tool
from threads_celery.settings import Settings
from threads_celery.testing import ScriptedModel, call, say


class WriteIn(BaseModel):
    name: str
    text: str


class ReadIn(BaseModel):
    name: str


def _write(inp: WriteIn, ctx) -> str:
    return ctx.files.write_text(inp.name, inp.text)


def _read(inp: ReadIn, ctx) -> str:
    return ctx.files.read_text(inp.name)


write = tool(name="write", description="Write a file.", input=WriteIn, effect="read_only", execute=_write)
read = tool(name="read", description="Read a file.", input=ReadIn, effect="read_only", execute=_read)


class ReviewIn(BaseModel):
    message: str
    files: list[str]


def _child_script(messages):
    first = messages[0].parts[-1].content
    ref = first.rpartition("Attachments: ")[2]
    return call("read", name=ref)


reviewer = Prompt(
    name="reviewer",
    instructions="Review the attached file and write notes.",
    model=ScriptedModel([_child_script, call("write", name="notes.txt", text="looks good"), say("Reviewed.")]),
    tools=[read, write],
)


def test_parent_files_are_copied_into_the_child_and_the_childs_files_come_back(tmp_path: Path) -> None:
    def read_returned(messages):
        result = json.loads(messages[-1].parts[0].content)
        return call("read", name=result["attachments"][0])

    parent = Agent(
        name="editor",
        instructions="x",
        model=ScriptedModel(
            [
                call("write", name="draft.txt", text="hello draft"),
                call("reviewer", message="please review", files=["draft.txt"]),
                read_returned,
                say("done"),
            ]
        ),
        tools=[
            write,
            read,
            reviewer.as_tool(input=ReviewIn, init_user_message_property="message", init_attachments_property="files"),
        ],
        permissions=Permissions.allow_all(),
    )
    settings = Settings(files_root=str(tmp_path / "files"))
    with Threads.embedded(settings=settings, reconcile_interval=None) as threads:
        run = threads.wait(threads.start(parent, "go").run_id, 30)
        assert run.status == "completed", run.error
        results = [m.text for m in threads.messages(run.thread_id) if m.role == "tool"]
        [child] = threads.agent_tool_runs(run.thread_id)
        child_results = [m.text for m in threads.messages(child.child_thread_id) if m.role == "tool"]
    assert child_results[0] == "hello draft"  # the child read its own copy of the parent's file
    shaped = json.loads(results[1])
    assert shaped["text"] == "Reviewed." and shaped["attachments"] == ["notes.txt"]
    assert results[2] == "looks good"  # the returned reference is valid in the parent's area
    assert (tmp_path / "files").is_dir()
