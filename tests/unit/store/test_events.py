"""The per-thread event log: every message and status change, in order, replayable once."""

from __future__ import annotations

from pydantic import BaseModel

from threads_celery import Agent, Threads, tool
from threads_celery.testing import ScriptedModel, call, say


class In(BaseModel):
    city: str


weather = tool(name="weather", description="Weather.", input=In, effect="read_only", execute=lambda i, c: "sunny")
agent = Agent(
    name="ev", instructions="x", model=ScriptedModel([call("weather", city="Oslo"), say("Sunny.")]), tools=[weather]
)


def test_events_cover_the_run_in_order_and_resume_from_a_cursor() -> None:
    with Threads.embedded() as threads:
        handle = threads.start(agent, "weather in Oslo?")
        assert threads.wait(handle.run_id, 20).status == "completed"
        events = [e for e in threads.events(handle.thread_id) if e.type != "tool_call_started"]
        kinds = [(e.type, e.payload.get("status") or e.payload.get("role")) for e in events]
        assert kinds == [
            ("run", "queued"),
            ("message", "user"),
            ("run", "running"),
            ("message", "assistant"),
            ("message", "tool"),
            ("message", "assistant"),
            ("run", "completed"),
        ]
        assert events[3].payload["tool_calls"][0]["name"] == "weather"
        assert events[-1].payload["output"] == "Sunny."
        everything = list(threads.events(handle.thread_id))
        assert [e.seq for e in everything] == list(range(1, len(everything) + 1))
        assert [e.type for e in everything].count("tool_call_started") == 1
        # A client that saw up to seq 3 gets the rest, once.
        last = everything[-1].seq
        assert [e.seq for e in threads.events(handle.thread_id, after=3)] == list(range(4, last + 1))
        assert list(threads.events(handle.thread_id, after=last)) == []


def test_follow_tails_new_events_until_the_timeout() -> None:
    with Threads.embedded() as threads:
        handle = threads.start(agent, "weather?")
        seen = []
        for event in threads.events(handle.thread_id, follow=True, timeout=20):
            seen.append(event)
            if event.type == "run" and event.payload["status"] == "completed":
                break
        assert seen[-1].payload["status"] == "completed"
        assert len({e.seq for e in seen}) == len(seen)
