"""RunView renders stored messages and run snapshots; no terminal, store or worker needed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from rich.console import Console, Group

from threads_celery.live import RunView, follow_run, format_args, format_result, shorten
from threads_celery.records import Message, Run, ToolCall, ToolResult

RUN = "run_1"
THREAD = "thread_1"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


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
        tool_calls=tuple(ToolCall(id=cid, name=name, args=json.dumps(args), effect_key=f"{RUN}:{seq}:{cid}") for cid, name, args in calls),
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


class FakeSource:
    """A store that advances one message per poll, like a run in progress."""

    def __init__(self, messages: list[Message], final: Run) -> None:
        self.pending = list(messages)
        self.seen: list[Message] = []
        self.final = final

    def get_run(self, run_id: str) -> Run:
        return self.final if not self.pending else run_in("running")

    def messages(self, thread_id: str, *, after: int = -1) -> list[Message]:
        if self.pending:
            self.seen.append(self.pending.pop(0))
        return [m for m in self.seen if m.seq > after]


def test_follow_run_polls_until_the_run_ends_and_prints_each_entry_once() -> None:
    source = FakeSource(CONVERSATION, run_in("completed", output="All set"))
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

        def messages(self, thread_id: str, *, after: int = -1) -> list[Message]:
            return []

    console = Console(record=True, width=100, color_system=None)
    final = follow_run(NeverEnds(), RUN, THREAD, console=console, timeout=0.01, poll_interval=0.001)
    assert final.status == "running"
