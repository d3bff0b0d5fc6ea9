"""A run's events as the parts of a chat reply (threads_celery.api.chat_common.ReplyParts), and
their encodings: the UI message stream's chunks and AG-UI's events."""

from __future__ import annotations

from typing import Any

from threads_celery.api import chat_parts as chat
from threads_celery.api.chat_agui import AguiEvents
from threads_celery.api.chat_vercel import chunks_of
from threads_celery.records import Event

RUN = "run_1"


class Pending:
    def __init__(self, effect_key: str, status: str = "awaiting_approval", kind: str = "call") -> None:
        self.effect_key, self.status, self.kind, self.run_id = effect_key, status, kind, RUN
        self.tool, self.args, self.reason = "send_email", '{"to": "ann"}', "asks first"


def parts(pending: list[Pending] | None = None, resolution: str | None = None) -> chat.ReplyParts:
    return chat.ReplyParts(
        run_id=RUN, shown=lambda s: s, pending=lambda _: list(pending or []), resolution_of=lambda _: resolution
    )


seq = iter(range(1, 10_000))


def event(type: str, run_id: str = RUN, **payload: Any) -> Event:
    return Event(thread_id="t", seq=next(seq), type=type, payload=payload, run_id=run_id)


def assistant(text: str = "", calls: list[dict[str, str]] | None = None) -> Event:
    return event("message", role="assistant", text=text, tool_calls=calls or [])


def texts(out: list[chat.Part]) -> str:
    return "".join(p.delta for p in out if isinstance(p, chat.TextDelta))


def test_streamed_text_is_completed_by_the_committed_message_not_repeated() -> None:
    reply = parts()
    out = reply.text_delta("Hel") + reply.text_delta("lo, ")
    out += reply.committed(assistant("Hello, world."))
    assert texts(out) == "Hello, world."
    assert [type(p) for p in out] == [
        chat.StepStart, chat.TextStart, chat.TextDelta, chat.TextDelta, chat.TextDelta, chat.TextEnd
    ]  # fmt: skip


def test_text_the_stream_does_not_lead_to_is_closed_and_the_committed_text_shown_whole() -> None:
    reply = parts()
    out = reply.text_delta("Draft that was void")
    out += reply.committed(assistant("Final."))
    starts = [p for p in out if isinstance(p, chat.TextStart)]
    ends = [p for p in out if isinstance(p, chat.TextEnd)]
    assert len(starts) == len(ends) == 2
    assert out[-2] == chat.TextDelta(starts[1].id, "Final.")


def test_a_void_step_closes_its_parts_and_says_so() -> None:
    reply = parts()
    out = reply.text_delta("abc") + reply.void(step=1, attempt=3)
    assert out[-2:] == [chat.TextEnd(out[1].id), chat.StepVoided(1, 3)]  # type: ignore[union-attr]  # out[1] is the TextStart
    out = reply.text_delta("again") + reply.committed(assistant("again"))
    assert texts(out) == "again"


def test_a_delta_replayed_is_not_fresh_and_after_a_gap_none_is_until_a_resync() -> None:
    reply = chat.ReplyParts(run_id=RUN, shown=lambda s: s, pending=lambda _: [], resolution_of=lambda _: None)
    assert reply.fresh(step=1, attempt=2, seq=1) and reply.fresh(1, 2, 2)
    assert not reply.fresh(1, 2, 1) and not reply.fresh(1, 2, 2)  # replayed from the step's start
    assert reply.fresh(1, 3, 1)  # a new attempt counts from 1 again
    assert not reply.fresh(1, 3, 3) and not reply.fresh(1, 3, 4)  # seq 2 was lost: wait for the message
    reply.resynced()
    assert reply.fresh(1, 3, 2) and reply.fresh(1, 3, 3)  # the replay after a resync fills the gap


def test_text_after_a_gap_is_completed_by_the_message_once() -> None:
    reply = parts()
    out = reply.text_delta("Hello ") if reply.fresh(1, 1, 1) else []
    out += reply.text_delta("lost") if reply.fresh(1, 1, 3) else []  # seq 2 never came
    out += reply.committed(assistant("Hello from the chat."))
    assert texts(out) == "Hello from the chat."


def test_tool_calls_start_before_their_arguments_and_results_follow() -> None:
    reply = parts()
    out = reply.committed(event("tool_call_started", call_id="c1", name="weather"))
    out += reply.committed(
        assistant(calls=[{"id": "c1", "name": "weather", "args": '{"city": "Paris"}', "effect_key": "k1"}])
    )
    out += reply.committed(
        event(
            "message",
            role="tool",
            text="21",
            tool_result={"call_id": "c1", "name": "weather", "content": "21", "is_error": False},
        )
    )
    assert out == [
        chat.StepStart(),
        chat.ToolStart("c1", "weather"),
        chat.ToolInput("c1", "weather", '{"city": "Paris"}', {"city": "Paris"}),
        chat.ToolOutput("c1", "weather", "21", False),
    ]


def test_a_denied_call_is_a_denial_and_other_runs_events_are_skipped() -> None:
    reply = parts(resolution="denied")
    reply.committed(assistant(calls=[{"id": "c1", "name": "send_email", "args": "{}", "effect_key": "k1"}]))
    assert reply.committed(event("message", run_id="run_other", role="assistant", text="not ours")) == []
    result = {"call_id": "c1", "name": "send_email", "content": "denied: no", "is_error": True}
    assert reply.committed(event("message", role="tool", text="denied: no", tool_result=result)) == [
        chat.ToolDenied("c1", "send_email", "denied: no")
    ]


def test_waiting_for_approval_ends_the_reply_with_its_requests() -> None:
    reply = parts([Pending("k1"), Pending("k2", status="parked")])
    reply.committed(assistant(calls=[{"id": "c1", "name": "send_email", "args": '{"to": "ann"}', "effect_key": "k1"}]))
    out = reply.committed(event("run", status="awaiting_approval"))
    assert out[0] == chat.ApprovalRequest("k1", "c1", "send_email", '{"to": "ann"}')
    assert isinstance(out[1], chat.Waiting) and out[1].status == "parked"
    assert out[-1] == chat.RunEnd("waiting") and reply.done
    assert reply.committed(event("run", status="completed")) == []


def test_the_encodings_keep_their_pairs_closed() -> None:
    reply = parts([Pending("k1")])
    out = reply.text_delta("Let me mail.")
    out += reply.tool_args_delta("c1", "send_email", '{"to": ')
    out += reply.committed(
        assistant("Let me mail.", [{"id": "c1", "name": "send_email", "args": '{"to": "ann"}', "effect_key": "k1"}])
    )
    out += reply.committed(event("run", status="awaiting_approval"))
    step = [False]
    chunks = [c.type for p in out for c in chunks_of(p, step)]
    assert chunks == [
        "start-step", "text-start", "text-delta", "text-end", "tool-input-start", "tool-input-delta",
        "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]  # fmt: skip
    agui = AguiEvents("t", "r", interrupts_supported=True)
    events = [e for p in out for e in agui.events(p)]
    kinds = [e.type.value if hasattr(e.type, "value") else e.type for e in events]
    assert kinds == [
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "TOOL_CALL_START", "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS", "TOOL_CALL_END", "RUN_FINISHED",
    ]  # fmt: skip
    args = "".join(e.delta for e in events if type(e).__name__ == "ToolCallArgsEvent")  # type: ignore[attr-defined]  # args events have a delta
    assert args == '{"to": "ann"}'
    assert events[3].parent_message_id == events[0].message_id  # type: ignore[attr-defined]  # start events name their ids
    assert events[-1].outcome.interrupts[0].id == "k1"  # type: ignore[attr-defined]  # the run's end carries the approval
