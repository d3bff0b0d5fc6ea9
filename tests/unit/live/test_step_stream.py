"""The worker's side of live deltas: redaction across fragments, storable text, coalescing and
numbering, and a bus that is down or slow never holding a model turn up."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence

from threads_celery.live.bus import MemoryBus, Outgoing
from threads_celery.live.redis_direct import DirectRedis, resp
from threads_celery.live.sender import AttemptStream, DeltaSender
from threads_celery.live.step_stream import StepStream
from threads_celery.live.wire import BusMessage, decode
from threads_celery.redaction import REDACTED

SECRET = "sk-live-4f9a1c2e8b7d6a5f"


class Recording:
    """A bus that keeps what it is sent."""

    namespace = ""

    def __init__(self) -> None:
        self.sent: list[Outgoing] = []

    def send(self, batch: Sequence[Outgoing]) -> None:
        self.sent.extend(batch)

    def listen(self, deliver: object) -> object:
        raise NotImplementedError

    def messages(self) -> list[BusMessage]:
        return [m for m in (decode(o.payload) for o in self.sent) if m is not None]

    def text(self) -> str:
        return "".join(d.text for m in self.messages() for d in m.deltas() if hasattr(d, "text"))


def stream_of(bus: Recording, secrets: Sequence[str] = ()) -> StepStream:
    sender = DeltaSender(bus, coalesce_s=0.001)  # type: ignore[arg-type]
    return StepStream(bus, "thread-1", "run-1", 2, 7, secrets=secrets, sender=sender)  # type: ignore[arg-type]


def test_a_secret_split_across_fragments_is_redacted_whole() -> None:
    bus = Recording()
    stream = stream_of(bus, [SECRET])
    reply = f"Your key is {SECRET} and nothing else. " * 3
    # Split so that the secret straddles fragment boundaries in several places.
    for start in range(0, len(reply), 5):
        stream.text(0, reply[start : start + 5])
        time.sleep(0.0005)
    stream.close(wait_s=2.0)
    sent = bus.text()
    assert SECRET not in sent
    assert SECRET[:10] not in sent and SECRET[-10:] not in sent
    assert sent == reply.replace(SECRET, REDACTED)
    raw = b"".join(o.payload for o in bus.sent).decode()
    assert SECRET[:10] not in raw


def test_nul_and_lone_surrogates_are_replaced_as_at_the_store_boundary() -> None:
    bus = Recording()
    stream = stream_of(bus)
    stream.text(0, "a\x00b")
    stream.text(0, "\ud800c")
    stream.args(1, '{"x": "\udfff"}')
    stream.close(wait_s=2.0)
    assert bus.text() == "a\ufffdb\ufffdc"
    [args] = [d for m in bus.messages() for d in m.deltas() if d.type == "tool_call_delta"]
    assert args.args == '{"x": "\ufffd"}'  # type: ignore[union-attr]


def test_a_tool_call_named_with_a_nul_or_a_lone_surrogate_streams_and_closes() -> None:
    bus = Recording()
    stream = stream_of(bus)
    stream.call(0, "call\x00id", "bad\ud800name")
    stream.args(0, "{}")
    stream.close(wait_s=2.0)  # raised while encoding the name before it was made storable
    calls = [d for m in bus.messages() for d in m.deltas() if d.type == "tool_call_delta"]
    assert calls and {(d.call_id, d.name) for d in calls} == {("call\ufffdid", "bad\ufffdname")}  # type: ignore[union-attr]


def test_fragments_are_coalesced_numbered_without_gaps_and_the_end_clears_the_buffer() -> None:
    bus = Recording()
    stream = stream_of(bus)
    for word in ["one ", "two ", "three ", "four"]:
        stream.text(0, word)
    stream.call(1, "call-1", "lookup")
    stream.args(1, '{"q":')
    stream.args(1, ' "x"}')
    stream.close(wait_s=2.0)
    deltas = [d for m in bus.messages() for d in m.deltas()]
    assert [d.seq for d in deltas] == list(range(1, len(deltas) + 1))
    assert "".join(d.text for d in deltas if d.type == "text_delta") == "one two three four"  # type: ignore[union-attr]
    assert bus.sent[0].buffer == "reset" and all(o.buffer == "append" for o in bus.sent[1:-1])
    assert bus.sent[-1].buffer == "clear" and bus.messages()[-1].ended
    assert all((m.run_id, m.step, m.attempt) == ("run-1", 2, 7) for m in bus.messages())


def test_a_void_attempt_says_so() -> None:
    bus = Recording()
    stream = stream_of(bus)
    stream.text(0, "half a rep")
    stream.void()
    stream.sender.flush(2.0)
    assert bus.messages()[-1].void and bus.sent[-1].buffer == "clear"


class Hanging:
    """A bus whose every send hangs until released, then fails (a Redis that does not answer)."""

    namespace = ""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def send(self, batch: Sequence[Outgoing]) -> None:
        self.calls += 1
        self.release.wait(5)
        raise ConnectionError("no answer")

    def listen(self, deliver: object) -> object:
        raise NotImplementedError


def test_a_bus_that_hangs_never_holds_the_model_turn_and_its_queue_stays_bounded() -> None:
    bus = Hanging()
    sender = DeltaSender(bus, coalesce_s=0.0, max_pending=100)  # type: ignore[arg-type]
    stream = AttemptStream("ch", "run-1", 0, 1)
    for i in range(5000):  # each its own message (no coalescing window)
        sender.fragment(stream, "t", 0, f"w{i} ")
    # The worker's thread went through 5000 fragments while the bus hung: the queue held at
    # most its bound and the rest was dropped and counted.
    assert len(sender._queue) <= 100
    assert sender.dropped >= 4000
    assert stream.seq + stream.dropped == 5000  # the dropped ones count: the next delta shows the gap
    bus.release.set()
    assert sender.flush(5.0)


def test_dropped_fragments_leave_a_gap_in_seq() -> None:
    bus = Recording()
    sender = DeltaSender(bus, coalesce_s=0.001)  # type: ignore[arg-type]
    stream = AttemptStream("ch", "run-1", 0, 1)
    sender.fragment(stream, "t", 0, "a")
    sender.flush(2.0)
    stream.dropped += 2  # as a full queue would have done
    sender.fragment(stream, "t", 0, "d")
    sender.end(stream, void=False)
    sender.flush(2.0)
    assert [d.seq for m in bus.messages() for d in m.deltas()] == [1, 4]


def test_the_memory_bus_keeps_the_step_in_progress_for_replay() -> None:
    bus = MemoryBus()
    sender = DeltaSender(bus, coalesce_s=0.0)  # each fragment its own message
    stream = StepStream(bus, "thread-9", "run-9", 0, 3, sender=sender)
    stream.text(0, "Hel")
    sender.flush(2.0)
    stream.text(0, "lo")
    sender.flush(2.0)
    listener = bus.listen(lambda batch: None)
    replayed = [decode(p) for p in listener.replay(stream.stream.channel)]
    assert "".join(d.text for m in replayed if m for d in m.deltas() if d.type == "text_delta") == "Hello"  # type: ignore[union-attr]
    stream.close(wait_s=2.0)
    assert listener.replay(stream.stream.channel) == []
    listener.close()


def test_resp_encoding_and_a_redis_that_is_not_there() -> None:
    assert resp(b"PUBLISH", b"ch", b"a\r\nb") == b"*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$4\r\na\r\nb\r\n"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the probe is closed
    direct = DirectRedis(f"redis://127.0.0.1:{port}/3")
    # Nothing connected: every write is dropped at once, and a connection is tried on a thread.
    assert [direct.write([resp(b"PING")]) for _ in range(100)] == [False] * 100
