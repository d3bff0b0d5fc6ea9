"""progress_argument: when tool_call_started fires, and with what progress (spec-tools.md §7)."""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

from threads_celery import Agent, Permissions, Threads, tool
from threads_celery.runtime.models import StreamEvent
from threads_celery.runtime.streaming import HeldStartedEvents, ToolCallStarted, ToolCallStarts
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


# -- held back, then recorded with the reply or on their own ------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_held_events_wait_for_the_reply_until_the_first_has_waited_long_enough() -> None:
    recorded: list[list[dict]] = []
    clock = _Clock()
    held = HeldStartedEvents(recorded.append, hold_s=2.0, clock=clock)
    passed: list[StreamEvent] = []
    feed = held.feeding(passed.append)
    held.add({"call_id": "a"})
    clock.now += 1.0
    held.add({"call_id": "b"})
    feed(StreamEvent("args", 0, text="{"))
    assert recorded == [] and held.payloads == [{"call_id": "a"}, {"call_id": "b"}]
    clock.now += 1.0  # the first has waited 2 s: the next stream event records both
    feed(StreamEvent("args", 0, text="}"))
    assert recorded == [[{"call_id": "a"}, {"call_id": "b"}]] and held.payloads == []
    assert [e.text for e in passed] == ["{", "}"]  # every event reached the step's own callback
    held.add({"call_id": "c"})  # a later start waits its own time
    feed(StreamEvent("args", 1, text="{"))
    assert held.payloads == [{"call_id": "c"}]


def test_a_flush_records_what_is_held_once_and_a_failure_to_record_is_only_logged(caplog) -> None:
    recorded: list[list[dict]] = []
    held = HeldStartedEvents(recorded.append)
    held.flush()
    assert recorded == []
    held.add({"call_id": "a"})
    held.flush()
    held.flush()
    assert recorded == [[{"call_id": "a"}]]

    def refuse(_: list[dict]) -> None:
        raise RuntimeError("store away")

    failing = HeldStartedEvents(refuse)
    failing.add({"call_id": "b"})
    failing.flush()  # does not raise: the step's own failure is what it handles
    assert failing.payloads == [] and "store away" in caplog.text


def test_a_quick_reply_records_its_started_events_with_it_and_a_slow_one_on_their_own(monkeypatch) -> None:
    import threads_celery.runtime.streaming as streaming
    from threads_celery.store import Store

    def run_once(name: str) -> tuple[list[str], int]:
        """The thread's events (messages by role) and how many were appended on their own."""
        alone: list[str] = []
        original = Store.append_event

        def counting(self, thread_id, run_id, type, payload, now):
            alone.append(type)
            return original(self, thread_id, run_id, type, payload, now)

        agent = Agent(
            name=name,
            instructions="Read.",
            model=ScriptedModel([calls(("read_file", {"path": "a"}), ("read_file", {"path": "b"})), say("ok")]),
            tools=[read_file],
            permissions=Permissions.allow_all(),
        )
        with monkeypatch.context() as patched, Threads.embedded() as threads:
            patched.setattr(Store, "append_event", counting)
            handle = threads.start(agent, "go")
            assert threads.wait(handle.run_id, 20).status == "completed"
            events = list(threads.events(handle.thread_id))
        kinds = [e.type if e.type != "message" else e.payload["role"] for e in events]
        assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
        return kinds, alone.count("tool_call_started")

    quick, quick_alone = run_once("quick")
    # The starts come before the reply that asked for the calls, each call's result after.
    first_reply = quick.index("assistant")
    assert quick[first_reply - 2 : first_reply + 1] == ["tool_call_started", "tool_call_started", "assistant"]
    assert quick_alone == 0  # written by the reply's commit

    monkeypatch.setattr(streaming, "STARTED_EVENTS_HELD_S", 0.0)  # every start waited long enough
    slow, slow_alone = run_once("slow")
    assert slow == quick and slow_alone == 2
