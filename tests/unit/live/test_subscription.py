"""The subscribing side: one attempt per step (a later one voids the earlier), each delta once,
none after a step ended; a subscriber that falls behind gets a resync and starts over; leaving
leaves nothing behind."""

from __future__ import annotations

import asyncio

from threads_celery import Agent, Threads
from threads_celery.live import Committed, Resync, StepEnd, StepVoid, TextDelta
from threads_celery.live.events import LiveEvent
from threads_celery.live.hub import LiveHub
from threads_celery.live.subscription import StepTracker, live_events
from threads_celery.live.wire import BusMessage
from threads_celery.records import Event
from threads_celery.testing import ScriptedModel, say


def deltas(run: str, step: int, attempt: int, *seqs: int) -> BusMessage:
    return BusMessage(run, step, attempt, fragments=tuple(("t", 0, s, f"<{s}>", "", "") for s in seqs))


def texts(events: list[LiveEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextDelta)]


def test_a_later_attempt_voids_the_earlier_one_then_streams_from_its_start() -> None:
    tracker = StepTracker()
    assert texts(tracker.on_message(deltas("r", 1, 5, 1, 2))) == ["<1>", "<2>"]
    out = tracker.on_message(deltas("r", 1, 9, 1))
    assert out[0] == StepVoid("r", 1, 5) and texts(out) == ["<1>"]
    # What the dead attempt's worker sent late is dropped.
    assert tracker.on_message(deltas("r", 1, 5, 3)) == []


def test_each_delta_is_sent_once_and_none_after_the_step_ended() -> None:
    tracker = StepTracker()
    assert texts(tracker.on_message(deltas("r", 0, 1, 1, 2))) == ["<1>", "<2>"]
    assert texts(tracker.on_message(deltas("r", 0, 1, 2, 3))) == ["<3>"]  # buffered and live
    assert tracker.on_message(BusMessage("r", 0, 1, ended=True, end_seq=3)) == [StepEnd("r", 0, 1, 3)]
    assert tracker.on_message(deltas("r", 0, 1, 4)) == []
    assert texts(tracker.on_message(deltas("r", 1, 2, 1))) == ["<1>"]  # the next step


def test_a_void_message_voids_what_was_sent_and_the_committed_message_closes_the_step() -> None:
    tracker = StepTracker()
    tracker.on_message(deltas("r", 0, 1, 1))
    assert tracker.on_message(BusMessage("r", 0, 1, void=True)) == [StepVoid("r", 0, 1)]
    tracker.on_message(deltas("r", 1, 2, 1))
    tracker.on_committed(Event("t", 9, "message", {"role": "assistant", "text": "x"}, run_id="r"))
    assert tracker.on_message(deltas("r", 1, 2, 2)) == []


def assistant(run: str, seq: int) -> Event:
    return Event("t", seq, "message", {"role": "assistant", "text": "x"}, run_id=run)


def test_the_end_names_the_last_seq_and_a_lost_tail_shows_as_a_gap() -> None:
    tracker = StepTracker()
    tracker.on_message(deltas("r", 0, 1, 1, 2))
    # The worker dropped deltas 3 and 4 (a broker that was down) and says its last seq was 4.
    assert tracker.on_message(BusMessage("r", 0, 1, ended=True, end_seq=4)) == [StepEnd("r", 0, 1, 4)]
    # A worker that does not name it: the last seq this subscriber got.
    tracker.on_message(deltas("r", 1, 1, 1))
    assert tracker.on_message(BusMessage("r", 1, 1, ended=True)) == [StepEnd("r", 1, 1, 1)]


def test_a_message_read_before_its_steps_end_waits_for_it() -> None:
    tracker = StepTracker()
    tracker.on_message(deltas("r", 0, 1, 1, 2))
    assert tracker.waits(assistant("r", 5)), "the step's end has not come: its message waits"
    assert not tracker.waits(assistant("other", 6)) and not tracker.waits(Event("t", 7, "run", {}, run_id="r"))
    tracker.on_message(BusMessage("r", 0, 1, ended=True, end_seq=3))
    assert not tracker.waits(assistant("r", 5))
    tracker.on_committed(assistant("r", 5))
    # The next step streams before the previous step's message was read: that message closes
    # the step that ended, not the one streaming now.
    tracker.on_message(deltas("r", 1, 1, 1))
    tracker.on_message(BusMessage("r", 1, 1, ended=True, end_seq=1))
    tracker.on_message(deltas("r", 2, 1, 1))
    assert not tracker.waits(assistant("r", 8))
    tracker.on_committed(assistant("r", 8))
    assert texts(tracker.on_message(deltas("r", 2, 1, 2))) == ["<2>"]
    assert tracker.waits(assistant("r", 9))


def test_a_subscriber_that_falls_behind_gets_a_resync_then_the_step_from_its_start(threads: Threads) -> None:
    reply = "".join(f"w{i} " for i in range(60))
    threads.register(
        Agent(name="live_flood", instructions="x", model=ScriptedModel([say(reply)], chunk_size=3, chunk_delay_s=0.003))
    )
    hub = LiveHub(threads.live_hub.bus, max_queue=3)
    handle = threads.start("live_flood", "go")
    run = threads.get_run(handle.run_id)

    async def stalled() -> list[LiveEvent]:
        seen: list[LiveEvent] = []
        async with live_events(threads.store, hub, run.thread_id) as events:
            async for event in events:
                seen.append(event)
                if isinstance(event, TextDelta) and len(seen) < 5:
                    await asyncio.sleep(0.3)  # stalled: the model writes on
                if isinstance(event, Committed) and event.type == "run" and event.payload["status"] == "completed":
                    return seen
        return seen

    seen = asyncio.run(stalled())
    resyncs = [i for i, e in enumerate(seen) if isinstance(e, Resync)]
    assert resyncs, "the stalled subscriber should have been told to resync"
    after = seen[resyncs[-1] + 1 :]
    message = [e for e in seen if isinstance(e, Committed) and e.type == "message" and e.payload["role"] == "assistant"]
    assert message and message[0].payload["text"] == reply
    # After the resync the committed events come again from the cursor, never one twice.
    committed = [e.seq for e in seen if isinstance(e, Committed)]
    assert committed == sorted(set(committed))
    assert any(isinstance(e, Committed) for e in after)
    assert hub.subscriber_count == 0 and hub.channel_count == 0
    hub.close()


def test_a_steps_stream_that_comes_after_its_message_is_dropped_up_to_its_end() -> None:
    tracker = StepTracker()
    # The message was read from the store before anything of its step's stream came.
    tracker.on_committed(assistant("r", 5))
    # So was the run's end (the stream is still on its way).
    tracker.on_committed(Event("t", 6, "run", {"status": "completed"}, run_id="r"))
    assert tracker.on_message(deltas("r", 0, 1, 1, 2)) == []
    assert tracker.on_message(deltas("r", 0, 1, 3)) == []
    assert tracker.on_message(BusMessage("r", 0, 1, ended=True, end_seq=3)) == []
    # The next step streams as usual.
    assert texts(tracker.on_message(deltas("r", 1, 1, 1))) == ["<1>"]
    # While catching up on the past, a message says nothing of a stream to come.
    catching_up = StepTracker()
    catching_up.on_committed(assistant("r", 5), live=False)
    assert texts(catching_up.on_message(deltas("r", 1, 1, 1))) == ["<1>"]
