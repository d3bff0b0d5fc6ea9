"""threads.stream(run_id) on the embedded default: deltas arrive while the model writes, typed,
and the committed message stays the truth."""

from __future__ import annotations

import asyncio

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel

from threads_celery import Agent, Threads, Variable, tool
from threads_celery.live import Committed, StepVoid, TextDelta, ToolCallDelta
from threads_celery.live.events import LiveEvent
from threads_celery.testing import ScriptedModel, call, say

REPLY = "The quick brown fox jumps over the lazy dog, streamed a few letters at a time."


class Query(BaseModel):
    q: str


lookup = tool(name="lookup", description="Look something up.", input=Query, effect="read_only",
              execute=lambda args, ctx: f"found {args.q}")  # fmt: skip


def slow_agent(name: str, *script: object, delay: float = 0.02) -> Agent:
    return Agent(
        name=name,
        instructions="Help.",
        model=ScriptedModel(list(script), chunk_size=4, chunk_delay_s=delay),  # type: ignore[arg-type]
        tools=[lookup],
    )


def _assistant_messages(events: list[LiveEvent]) -> list[Committed]:
    return [
        e for e in events if isinstance(e, Committed) and e.type == "message" and e.payload.get("role") == "assistant"
    ]


def test_text_deltas_arrive_before_the_message_commits_and_add_up_to_it(threads: Threads) -> None:
    threads.register(slow_agent("live_streamer", say(REPLY)))
    handle = threads.start("live_streamer", "hi")
    events = list(threads.stream(handle.run_id))
    messages = _assistant_messages(events)
    assert len(messages) == 1
    before = events[: events.index(messages[0])]
    deltas = [e for e in before if isinstance(e, TextDelta)]
    assert len(deltas) >= 3, f"expected the reply in several deltas before its commit, got {len(deltas)}"
    assert [d.seq for d in deltas] == list(range(1, len(deltas) + 1))
    assert "".join(d.text for d in deltas) == messages[0].payload["text"] == REPLY
    assert all(d.run_id == handle.run_id and d.step == deltas[0].step for d in deltas)
    assert not any(isinstance(e, StepVoid) for e in events)
    last = events[-1]
    assert isinstance(last, Committed) and last.type == "run" and last.payload["status"] == "completed"


def test_tool_call_arguments_stream_as_deltas_with_the_call_named(threads: Threads) -> None:
    threads.register(slow_agent("live_caller", call("lookup", q="pangolins"), say("done")))
    handle = threads.start("live_caller", "look")
    events = list(threads.stream(handle.run_id))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls and {c.name for c in calls} == {"lookup"}
    assert "".join(c.args for c in calls) == '{"q": "pangolins"}'
    assert len(_assistant_messages(events)) == 2


def test_the_async_iterator_yields_the_same_typed_events(threads: Threads) -> None:
    threads.register(slow_agent("live_async_streamer", say(REPLY)))
    handle = threads.start("live_async_streamer", "hi")

    async def collect() -> list[LiveEvent]:
        return [e async for e in threads.stream(handle.run_id)]

    events = asyncio.run(collect())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == REPLY
    assert len(_assistant_messages(events)) == 1


def test_leaving_a_stream_early_leaves_no_subscription(threads: Threads) -> None:
    threads.register(slow_agent("live_left", say(REPLY), delay=0.05))
    handle = threads.start("live_left", "hi")
    for event in threads.stream(handle.run_id):
        if isinstance(event, TextDelta):
            break
    assert threads.live_hub.subscriber_count == 0
    assert threads.live_hub.channel_count == 0
    threads.wait(handle.run_id)


def test_a_threads_secret_is_redacted_in_its_deltas_even_split_across_fragments(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())
    secret = "sk-live-93c1b7aa20f54e1d"
    agent = Agent(
        name="live_secret_teller",
        instructions="Tell.",
        model=ScriptedModel([say(f"The key is {secret}, keep it safe.")], chunk_size=3, chunk_delay_s=0.005),
        variables=[Variable("API_KEY", "secret")],
    )
    handle = threads.start(agent, "go", env={"API_KEY": secret})
    events = list(threads.stream(handle.run_id))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "The key is ***, keep it safe."
    assert not any(secret[:8] in e.text for e in events if isinstance(e, TextDelta))
