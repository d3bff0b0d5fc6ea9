"""RunView renders stored messages, events and run snapshots; no terminal, store or worker needed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console, Group

from threads_celery.cli.live import (
    RunView,
    format_args,
    format_result,
    message_from_event,
    shorten,
)
from threads_celery.cli.watch import follow_run, follow_thread
from threads_celery.records import Event, Message, Run, ToolCall, ToolResult

RUN = "run_1"
THREAD = "thread_1"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def run_in(status: str, *, output: str | None = None, error: str | None = None, took: float = 1.5) -> Run:
    ended = status in ("completed", "error", "aborted", "interrupted")
    return Run(
        id=RUN,
        thread_id=THREAD,
        agent="trip-planner",
        status=status,  # type: ignore[arg-type]
        step=2,
        fence=3,
        input="plan my trip",
        output=output,
        error=error,
        created_at=T0,
        finished_at=T0 + timedelta(seconds=took) if ended else None,
    )


def user(seq: int, text: str, run_id: str = RUN) -> Message:
    return Message(thread_id=THREAD, seq=seq, role="user", text=text, run_id=run_id)


def assistant(seq: int, text: str, *calls: tuple[str, str, dict[str, object]], run_id: str = RUN) -> Message:
    return Message(
        thread_id=THREAD,
        seq=seq,
        role="assistant",
        text=text,
        tool_calls=tuple(
            ToolCall(id=cid, name=name, args=json.dumps(args), effect_key=f"{RUN}:{seq}:{cid}")
            for cid, name, args in calls
        ),
        run_id=run_id,
    )


def tool(seq: int, call_id: str, name: str, content: str, *, is_error: bool = False) -> Message:
    return Message(
        thread_id=THREAD,
        seq=seq,
        role="tool",
        text=content,
        tool_result=ToolResult(call_id=call_id, name=name, content=content, is_error=is_error),
        run_id=RUN,
    )


CONVERSATION = [
    user(0, "plan my trip to Lisbon"),
    assistant(1, "Checking the weather first.", ("c1", "get_weather", {"city": "Lisbon", "day": "tomorrow"})),
    tool(2, "c1", "get_weather", json.dumps({"city": "Lisbon", "conditions": "sunny", "high_c": 24})),
    assistant(
        3,
        "",
        ("c2", "book_table", {"restaurant": "Taberna", "party_size": 2}),
        ("c3", "send_email", {"to": "me@example.com"}),
    ),
    tool(4, "c2", "book_table", "TBL-42 confirmed"),
    tool(5, "c3", "send_email", "SMTPError: mailbox unavailable", is_error=True),
    assistant(6, "All set: sunny, table TBL-42 booked, but the email failed."),
]


def render(renderable: object) -> str:
    console = Console(record=True, width=100, color_system=None)
    console.print(Group(*renderable) if isinstance(renderable, list) else renderable)
    return console.export_text()


def test_a_completed_run_shows_calls_args_results_errors_and_the_answer() -> None:
    view = RunView(run_id=RUN)
    view.add_all(CONVERSATION)
    view.update(run_in("completed", output="All set"))

    text = render(view.render())

    assert "trip-planner" in text and RUN in text
    assert "plan my trip to Lisbon" in text
    assert "turn 1" in text and "Checking the weather first." in text
    assert 'get_weather(city="Lisbon", day="tomorrow")' in text
    assert '"conditions": "sunny"' in text
    assert 'book_table(restaurant="Taberna", party_size=2)' in text
    assert "TBL-42 confirmed" in text
    assert "send_email" in text and "✗ SMTPError: mailbox unavailable" in text
    assert "answer" in text and "All set: sunny, table TBL-42 booked" in text
    assert "completed in 1.50s" in text and "3 model turns" in text and "3 tool calls" in text


def test_tool_errors_are_styled_red_and_results_are_not() -> None:
    view = RunView(run_id=RUN)
    view.add_all(CONVERSATION)
    view.update(run_in("completed"))
    console = Console(record=True, width=100, force_terminal=True, color_system="standard")
    console.print(view.render())
    lines = console.export_text(styles=True).splitlines()

    def line_with(fragment: str) -> str:
        return next(line for line in lines if fragment in line)

    red = "\x1b[31m"  # SGR 31: red foreground
    assert red in line_with("SMTPError")
    assert red not in line_with("TBL-42 confirmed")


def test_settled_entries_are_taken_once_in_order_and_a_running_call_holds_back_the_rest() -> None:
    view = RunView(run_id=RUN)
    view.update(run_in("running"))
    view.add_all(CONVERSATION[:2])  # the user message, and a turn whose call has no result yet

    first = render(view.take_settled())
    assert "plan my trip to Lisbon" in first and "get_weather" not in first
    live = render(view.render_live())
    assert "get_weather" in live and "running" in live

    view.add(CONVERSATION[2])
    second = render(view.take_settled())
    assert "get_weather" in second and "sunny" in second
    assert "plan my trip" not in second  # not taken twice
    assert view.take_settled() == []


def test_messages_of_other_runs_and_repeated_messages_are_ignored() -> None:
    view = RunView(run_id=RUN)
    view.add(user(0, "an earlier question", run_id="run_0"))
    view.add(assistant(1, "an earlier answer", run_id="run_0"))
    view.add(user(2, "plan my trip to Lisbon"))
    view.add(user(1, "a replayed message"))  # seq already seen
    view.add(Message(thread_id=THREAD, seq=2, role="user", text="stale", run_id=RUN))
    view.update(run_in("running"))

    text = render(view.render())

    assert "earlier" not in text and "replayed" not in text and "stale" not in text
    assert "plan my trip to Lisbon" in text


def test_an_errored_run_shows_its_error_and_a_parked_run_says_it_waits() -> None:
    errored = RunView(run_id=RUN)
    errored.add_all(CONVERSATION[:2])
    errored.update(run_in("error", error="model step 1 failed after 4 attempts: boom"))
    text = render(errored.render())
    assert "✘ error" in text and "model step 1 failed after 4 attempts: boom" in text
    assert "no result" in text  # the call that never got a result

    parked = RunView(run_id=RUN)
    parked.add_all(CONVERSATION[:4])
    parked.update(run_in("awaiting_approval"))
    text = render(parked.render())
    assert "⏸ awaiting approval" in text and "waits for approval" in text


def test_a_note_shows_under_its_call() -> None:
    view = RunView(run_id=RUN)
    view.add_all(CONVERSATION[:5])
    view.update(run_in("running"))

    assert view.note_call(f"{RUN}:3:c2", "✓ approved by cli:me") is True
    assert view.note_call("no-such-key", "lost") is False

    lines = render(view.render()).splitlines()
    booked = next(i for i, line in enumerate(lines) if "book_table(" in line)
    assert "✓ approved by cli:me" in lines[booked + 1]
    assert "TBL-42 confirmed" in lines[booked + 2]
    assert "lost" not in "\n".join(lines)


def test_markup_in_content_is_shown_literally() -> None:
    view = RunView(run_id=RUN)
    view.add(user(0, "[bold red]not markup[/]"))
    view.add(assistant(1, "[link=x]also not[/link]"))
    view.update(run_in("completed"))
    text = render(view.render())
    assert "[bold red]not markup[/]" in text and "[link=x]also not[/link]" in text


def test_arguments_and_results_are_made_readable_and_cut() -> None:
    assert format_args('{"city": "Paris", "n": 2, "tags": ["a"]}') == 'city="Paris", n=2, tags=["a"]'
    assert format_args("not json {") == "not json {"
    assert format_args('{"text": "' + "x" * 500 + '"}', limit=40).endswith("…")
    assert len(format_args('{"text": "' + "x" * 500 + '"}', limit=40)) == 40
    assert format_result('{"a":1,"b":[1,2]}') == '{"a": 1, "b": [1, 2]}'
    many = "\n".join(f"line {i}" for i in range(20))
    cut = format_result(many, max_lines=3)
    assert cut.splitlines() == ["line 0", "line 1", "line 2", "… (17 more lines)"]
    assert shorten("abcdef", 4) == "abc…" and shorten("abc", 4) == "abc"


def message_event(seq: int, message: Message) -> Event:
    """The event the store appends with a message (same payload)."""
    payload: dict[str, Any] = {"seq": message.seq, "role": message.role, "text": message.text}
    if message.tool_calls:
        payload["tool_calls"] = [c.to_json() for c in message.tool_calls]
    if message.tool_result is not None:
        payload["tool_result"] = message.tool_result.to_json()
    if message.meta:
        payload["meta"] = message.meta
    return Event(thread_id=THREAD, seq=seq, type="message", payload=payload, run_id=message.run_id)


def as_events(messages: list[Message], first_seq: int = 1) -> list[Event]:
    return [message_event(first_seq + i, m) for i, m in enumerate(messages)]


class FakeSource:
    """A store that advances one event per poll, like a run in progress."""

    def __init__(self, events: list[Event], final: Run) -> None:
        self.pending = list(events)
        self.seen: list[Event] = []
        self.final = final

    def get_run(self, run_id: str) -> Run:
        return self.final if not self.pending else run_in("running")

    def events(self, thread_id: str, after: int = 0) -> list[Event]:
        if self.pending:
            self.seen.append(self.pending.pop(0))
        return [e for e in self.seen if e.seq > after]


def test_follow_run_polls_until_the_run_ends_and_prints_each_entry_once() -> None:
    source = FakeSource(as_events(CONVERSATION), run_in("completed", output="All set"))
    console = Console(record=True, width=100, color_system=None)
    view = RunView(run_id=RUN)

    final = follow_run(source, RUN, THREAD, console=console, view=view, poll_interval=0)
    console.print(view.render_live())
    text = console.export_text()

    assert final.status == "completed"
    assert text.count("get_weather(") == 1 and text.count("plan my trip to Lisbon") == 1
    assert "TBL-42 confirmed" in text and "All set: sunny" in text and "✔ completed" in text


def test_follow_run_stops_at_the_timeout_with_the_run_still_going() -> None:
    class NeverEnds:
        def get_run(self, run_id: str) -> Run:
            return run_in("running")

        def events(self, thread_id: str, after: int = 0) -> list[Event]:
            return []

    console = Console(record=True, width=100, color_system=None)
    final = follow_run(NeverEnds(), RUN, THREAD, console=console, timeout=0.01, poll_interval=0.001)
    assert final.status == "running"


def test_follow_run_keeps_watching_a_stopped_run_while_asked_to() -> None:
    asked: list[str] = []

    class Ended:
        def get_run(self, run_id: str) -> Run:
            return run_in("completed")

        def events(self, thread_id: str, after: int = 0) -> list[Event]:
            return []

    def keep_watching(run: Run) -> bool:
        asked.append(run.status)
        return len(asked) < 3  # e.g. background child runs still going for two more polls

    console = Console(record=True, width=100, color_system=None)
    final = follow_run(Ended(), RUN, THREAD, console=console, poll_interval=0, keep_watching=keep_watching)
    assert final.status == "completed" and asked == ["completed"] * 3


# -- events and child agent-tool runs ---------------------------------------------------------

KEY = f"{RUN}:3:0"  # the effect key of the research call below


def event(seq: int, type: str, payload: dict[str, Any], *, parent_run: str = RUN) -> Event:
    """An event of the thread's log; ``parent_run`` is the run it belongs to (Event.run_id)."""
    return Event(thread_id=THREAD, seq=seq, type=type, payload=payload, run_id=parent_run)


def research_turn() -> list[Event]:
    return as_events(
        [
            user(0, "compare HTTP/3 and gRPC"),
            Message(
                thread_id=THREAD,
                seq=1,
                role="assistant",
                text="Researching.",
                tool_calls=(ToolCall(id="c1", name="research", args='{"topic": "HTTP/3"}', effect_key=KEY),),
                run_id=RUN,
            ),
        ]
    )


def started(seq: int, run_id: str, display: str, preview: str) -> Event:
    payload = {
        "run_id": run_id,
        "agent_type": display,
        "display": display,
        "input_preview": preview,
        "order": 0,
        "sequence": 0,
    }
    return event(seq, "agent_tool.started", payload)


def test_a_child_run_shows_under_its_call_with_a_bar_its_phase_and_its_milestones() -> None:
    child = f"agent-tool:{KEY}"
    view = RunView(run_id=RUN)
    view.add_events(
        [
            *research_turn(),
            started(3, child, "researcher", '{"topic": "HTTP/3"}'),
            event(
                4,
                "agent_tool.progress",
                {"run_id": child, "fraction": 0.5, "phase": "reading", "message": "source 2/4"},
            ),
            event(5, "agent_tool.milestone", {"run_id": child, "sequence": 1, "name": "outline", "data": None}),
        ]
    )
    view.update(run_in("waiting"))

    lines = render(view.render_live()).splitlines()
    call = next(i for i, line in enumerate(lines) if 'research(topic="HTTP/3")' in line)
    row = lines[call + 1]
    assert "researcher · HTTP/3" in row and "running" in row
    assert "━" in row and "50%" in row  # the progress bar and its fraction
    assert "reading · source 2/4" in row and "◆ outline" in row
    assert "waiting on a child run" in "\n".join(lines)
    assert view.take_settled() and "researcher" not in render(view.take_settled())  # the turn waits on it


def test_terminal_child_states_are_coloured_green_red_and_yellow() -> None:
    view = RunView(run_id=RUN)
    view.add_events(research_turn())
    ends = [
        ("ok", "agent_tool.finished", {"summary": "done"}),
        ("bad", "agent_tool.error", {"error": "boom"}),
        ("late", "agent_tool.interrupted", {"error": "gone quiet", "reason": "no-progress"}),
    ]
    seq = 3
    for name, kind, payload in ends:
        view.add_event(started(seq, f"run-{name}", name, '"x"'))
        view.add_event(event(seq + 1, kind, {"run_id": f"run-{name}", **payload}))
        seq += 2
    console = Console(record=True, width=140, force_terminal=True, color_system="standard")
    console.print(view.render())
    lines = console.export_text(styles=True).splitlines()
    plain = render(view.render())

    def line_with(fragment: str) -> str:
        return next(line for line in lines if fragment in line)

    assert "\x1b[1;32m" in line_with("completed")  # bold green
    assert "\x1b[1;31m" in line_with("boom")  # bold red
    assert "\x1b[1;33m" in line_with("interrupted")  # bold yellow: a soft stop, not a failure
    assert "no-progress: gone quiet" in plain and "boom" in plain


def test_a_background_child_outlives_its_call_in_the_live_region_and_its_end_is_logged_once() -> None:
    child = f"agent-tool:{KEY}:0"  # what ctx.run_agent_tool names the first child of a call
    view = RunView(run_id=RUN)
    view.update(run_in("running"))
    view.add_events([*research_turn(), started(3, child, "import", '"Import benchmarks"')])
    view.add_event(message_event(4, tool(2, "c1", "research", '{"run_id": "x", "status": "running"}')))

    settled = render(view.take_settled())
    assert "⇢ started import in the background" in settled and "━" not in settled

    view.add_event(event(5, "agent_tool.progress", {"run_id": child, "fraction": 0.25, "message": "batch 3/12"}))
    view.add_event(event(6, "agent_tool.milestone", {"run_id": child, "sequence": 1, "name": "halfway", "data": None}))
    live = render(view.render_live())
    assert "import · Import benchmarks" in live and "25%" in live and "batch 3/12" in live and "◆ halfway" in live

    view.update(run_in("completed"))
    assert "background child runs still going" in render(view.render_live())
    view.add_event(event(7, "agent_tool.finished", {"run_id": child, "summary": "Imported 1200 records"}))
    logged = render(view.take_settled())
    assert "✔ import" in logged and "completed" in logged and "100%" in logged and "Imported 1200" in logged
    assert "import ·" not in render(view.render_live())  # no longer moving
    assert view.take_settled() == []  # logged once


def test_child_events_of_other_runs_and_replayed_events_are_ignored() -> None:
    view = RunView(run_id=RUN)
    view.add_events(research_turn())
    view.add_event(started(3, "theirs", "someone-else", '"x"'))
    view.add_event(event(3, "agent_tool.started", {"run_id": "dup", "display": "dup"}))  # seq seen already
    view.add_event(
        event(4, "agent_tool.started", {"run_id": "x", "display": "other-run-child"}, parent_run="run_other")
    )
    view.update(run_in("waiting"))

    text = render(view.render())
    assert "someone-else" in text  # same run: shown
    assert "dup" not in text and "other-run-child" not in text
    assert [c.run_id for c in view.children] == ["theirs"]


def test_message_events_become_messages_and_a_narrated_milestone_is_a_note_not_an_answer() -> None:
    replayed = message_from_event(as_events(CONVERSATION)[3])
    assert replayed == CONVERSATION[3]
    assert message_from_event(event(9, "run", {"run_id": RUN, "status": "running"})) is None

    view = RunView(run_id=RUN)
    view.add_events(as_events(CONVERSATION[:3]))
    narrated = Message(
        thread_id=THREAD,
        seq=3,
        role="assistant",
        text="[import] reached halfway",
        meta={"source": "agent-tool-milestone"},
    )
    view.add_event(message_event(4, narrated))
    view.update(run_in("completed"))
    text = render(view.render())
    assert "◆ [import] reached halfway" in text
    assert "answer" not in text and "1 model turn " in text


def test_a_thread_view_logs_runs_starting_and_ending_and_notes_who_waits_on_a_person() -> None:
    view = RunView(thread_id=THREAD)
    view.add_event(event(1, "run", {"run_id": RUN, "status": "queued", "agent": "trip-planner"}))
    view.add_events(as_events(CONVERSATION[:2], first_seq=2))
    view.add_event(event(4, "run", {"run_id": RUN, "status": "running"}))
    view.add_event(event(5, "run", {"run_id": RUN, "status": "awaiting_approval"}))
    view.add_event(message_event(6, CONVERSATION[2]))
    view.add_event(event(7, "run", {"run_id": RUN, "status": "error", "error": "boom"}))

    lines = render([view.render_header(), *view.take_settled()]).splitlines()
    assert lines[0].startswith(f"▶ thread {THREAD}") and "trip-planner" in lines[0]
    assert f"▶ run {RUN}  trip-planner" in lines[1]
    weather = next(i for i, line in enumerate(lines) if "get_weather(" in line)
    assert "⏸ awaiting approval" in lines[weather + 1] and "sunny" in lines[weather + 2]
    assert f"✘ run {RUN} error: boom" in lines[-1]
    assert not any("running" in line for line in lines)  # running/waiting flips are not logged


def test_follow_thread_replays_once_and_can_tail_until_its_timeout() -> None:
    class Log:
        def __init__(self) -> None:
            self.reads: list[int] = []

        def events(self, thread_id: str, after: int = 0) -> list[Event]:
            self.reads.append(after)
            return [e for e in as_events(CONVERSATION) if e.seq > after]

    replay, log = Console(record=True, width=100, color_system=None), Log()
    view = follow_thread(log, THREAD, console=replay, follow=False)
    assert log.reads == [0] and view.last_event_seq == len(CONVERSATION)  # one read, no tailing

    tail, log = Console(record=True, width=100, color_system=None), Log()
    view = follow_thread(log, THREAD, console=tail, follow=True, timeout=0.05, poll_interval=0.001)
    assert len(log.reads) > 1 and set(log.reads[1:]) == {len(CONVERSATION)}  # kept asking from the cursor
    text = tail.export_text()
    assert text.count("get_weather(") == 1 and "All set: sunny" in text
