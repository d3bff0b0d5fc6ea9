"""progress_argument: when tool_call_started fires, and with what progress (spec-tools.md §7)."""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

from threads_celery import Agent, Permissions, Threads, tool
from threads_celery.runtime.models import StreamEvent
from threads_celery.runtime.streaming import ToolCallStarted, ToolCallStarts
from threads_celery.testing import ScriptedModel, calls, say


class WriteIn(BaseModel):
    description: str = Field(description='e.g. "writing index.html"')
    path: str
    content: str


class PlainIn(BaseModel):
    path: str


write_file = tool(
    name="write_file",
    description="Write a file.",
    input=WriteIn,
    effect="read_only",
    progress_argument="description",
    execute=lambda i, c: f"wrote {len(i.content)} bytes",
)
read_file = tool(name="read_file", description="Read.", input=PlainIn, effect="read_only", execute=lambda i, c: "text")


def _stream(args: str, size: int = 7) -> list[StreamEvent]:
    return [StreamEvent("args", 0, text=args[i : i + size]) for i in range(0, len(args), size)]


def test_with_a_progress_argument_the_start_fires_once_that_argument_finished_streaming() -> None:
    started: list[tuple[ToolCallStarted, int]] = []
    fed = 0
    starts = ToolCallStarts([write_file], lambda s: started.append((s, fed)))
    big = "x" * 5000
    args = json.dumps({"description": "writing index.html", "path": "index.html", "content": big})
    starts.feed(StreamEvent("call", 0, name="write_file", call_id="c1"))
    assert started == []  # name known, progress argument not yet
    events = _stream(args)
    for event in events:
        starts.feed(event)
    starts.finish()
    [(event, at)] = started
    assert event == ToolCallStarted(index=0, call_id="c1", name="write_file", progress="writing index.html")
    # It fired long before the large content argument had streamed.
    assert at < len(events) // 10


def test_without_a_progress_argument_the_start_fires_as_soon_as_the_call_appears() -> None:
    started: list[ToolCallStarted] = []
    starts = ToolCallStarts([read_file], started.append)
    starts.feed(StreamEvent("call", 0, name="read_file", call_id="c1"))
    assert started == [ToolCallStarted(0, "c1", "read_file", None)]
    for event in _stream('{"path": "a.txt"}'):
        starts.feed(event)
    starts.finish()
    assert len(started) == 1


def test_if_the_model_never_sends_the_argument_the_start_fires_when_the_call_finishes() -> None:
    started: list[ToolCallStarted] = []
    starts = ToolCallStarts([write_file], started.append)
    starts.feed(StreamEvent("call", 0, name="write_file", call_id="c1"))
    for event in _stream('{"path": "a", "content": "b"}'):
        starts.feed(event)
    assert started == []
    starts.finish()
    assert started == [ToolCallStarted(0, "c1", "write_file", None)]


def test_an_unfinished_progress_string_is_not_reported_early() -> None:
    started: list[ToolCallStarted] = []
    starts = ToolCallStarts([write_file], started.append)
    starts.feed(StreamEvent("call", 0, name="write_file", call_id="c1"))
    starts.feed(StreamEvent("args", 0, text='{"description": "writing ind'))
    assert started == []
    starts.feed(StreamEvent("args", 0, text='ex.html", "path"'))
    assert [s.progress for s in started] == ["writing index.html"]


def test_runs_record_tool_call_started_events_with_progress() -> None:
    content = "y" * 3000
    model = ScriptedModel(
        [
            calls(
                ("write_file", {"description": "writing index.html", "path": "index.html", "content": content}),
                ("read_file", {"path": "index.html"}),
            ),
            say("Done."),
        ]
    )
    agent = Agent(
        name="writer",
        instructions="Write.",
        model=model,
        tools=[write_file, read_file],
        permissions=Permissions.allow_all(),
    )
    with Threads.embedded() as threads:
        handle = threads.start(agent, "write it")
        assert threads.wait(handle.run_id, 20).status == "completed"
        started = [e.payload for e in threads.events(handle.thread_id) if e.type == "tool_call_started"]
    assert [(p["name"], p["progress"]) for p in started] == [("write_file", "writing index.html"), ("read_file", None)]
    assert started[0]["effect_key"] == f"{handle.run_id}:0:0"
