"""The live view shows the model's text as it is written: deltas in the live region, replaced by
the committed message, forgotten when their attempt is voided."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console

from tests.unit.cli.test_live import RUN, THREAD, as_events, assistant, render, run_in, user
from threads_celery.cli.live import RunView
from threads_celery.cli.watch import follow_run
from threads_celery.live import Resync, StepVoid, TextDelta, ThinkingDelta
from threads_celery.records import Event, Run


def delta(text: str, seq: int, *, attempt: int = 1, step: int = 0) -> TextDelta:
    return TextDelta(RUN, step, attempt, 0, seq, text)


def test_deltas_show_in_the_live_region_until_the_message_commits() -> None:
    view = RunView(run_id=RUN)
    view.add(user(1, "hi"))
    view.update(run_in("running"))
    for i, word in enumerate(["Hello", " the", "re"], start=1):
        view.partial.add(delta(word, i))
    live = render(view.render_live())
    assert "Hello there" in live and "model writing" in live
    assert "✎" in live
    view.add(assistant(2, "Hello there, done."))
    assert "✎" not in render(view.render_live()) and not view.partial.writing


def test_a_void_attempt_or_a_resync_clears_the_partial_text() -> None:
    view = RunView(run_id=RUN)
    view.update(run_in("running"))
    view.partial.add(delta("first try", 1))
    view.partial.add(StepVoid(RUN, 0, 1))
    assert "first try" not in render(view.render_live())
    view.partial.add(delta("second", 1, attempt=2))
    view.partial.add(ThinkingDelta(RUN, 0, 2, 1, 2, "hmm"))
    assert "second" in render(view.render_live()) and "hmm" in render(view.render_live())
    view.partial.add(Resync(after=3))
    assert "second" not in render(view.render_live())


class Streaming:
    """A source that streams deltas, as Threads does."""

    def __init__(self) -> None:
        self.log = as_events([user(1, "hi"), assistant(2, "All done.")])
        self.streamed: list[str] = []

    def get_run(self, run_id: str) -> Run:
        return run_in("completed" if self.streamed else "running", output="All done.")

    def events(self, thread_id: str, after: int = 0) -> list[Event]:
        return [e for e in self.log if e.seq > after] if self.streamed else []

    def stream(self, run_id: str) -> Iterator[Any]:
        for i, word in enumerate(["All", " done."], start=1):
            self.streamed.append(word)
            yield delta(word, i)


def test_follow_run_feeds_the_views_partial_text_from_a_streaming_source() -> None:
    source = Streaming()
    view = RunView(run_id=RUN)
    console = Console(record=True, width=100)
    final = follow_run(source, RUN, THREAD, console=console, view=view, poll_interval=0.01, timeout=10)
    assert final.status == "completed" and source.streamed == ["All", " done."]
    assert "All done." in console.export_text()
