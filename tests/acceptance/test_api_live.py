"""Live deltas over the HTTP API's event stream, served by uvicorn on a real socket: the reply's
text arrives in text_delta frames before its message commits, a reconnect with Last-Event-ID gets
the committed events after it plus the step in progress from its start, another tenant's thread
of the same name shows none of it, and a client that disconnects leaves no subscription behind."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from tests.support.processes import free_port
from tests.support.waiting import eventually
from threads_celery import Agent, Threads
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, say

ALICE = {"Authorization": "Bearer tok-alice-acme-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-globex-0123456789"}
TOKENS = "alice@acme=tok-alice-acme-0123456789, bob@globex=tok-bob-globex-0123456789"
REPLY = "Streaming, one small piece at a time, so that a page can show it as it is written."
STREAM_DEADLINE_S = 30.0


@dataclass(frozen=True)
class Frame:
    event: str
    data: dict[str, Any]
    id: int | None


def frames(response: httpx.Response) -> Iterator[Frame]:
    fields: dict[str, str] = {}
    deadline = time.monotonic() + STREAM_DEADLINE_S
    for line in response.iter_lines():
        assert time.monotonic() < deadline, "the stream stalled"
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:
            yield Frame(
                fields.get("event", "message"),
                json.loads(fields["data"]),
                int(fields["id"]) if "id" in fields else None,
            )
        fields = {}


def until_run_ends(response: httpx.Response, run_id: str) -> list[Frame]:
    seen = []
    for frame in frames(response):
        seen.append(frame)
        if frame.event == "run" and frame.data["run_id"] == run_id and frame.data["payload"]["status"] == "completed":
            return seen
    raise AssertionError("the stream ended")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Threads]]:
    with Threads.embedded() as threads:
        threads.register(
            Agent(
                name="live_api_writer",
                instructions="x",
                model=ScriptedModel([say(REPLY)], chunk_size=4, chunk_delay_s=0.03),
            )
        )
        app = create_api(threads, env={"THREADS_API_TOKENS": TOKENS}, keepalive_s=0.2)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        eventually(lambda: server.started, timeout=20, what="uvicorn started")
        try:
            yield f"http://127.0.0.1:{port}", threads
        finally:
            server.should_exit = True
            thread.join(10)


def start(base: str, caller: dict[str, str], **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{base}/v1/runs", json={"agent": "live_api_writer", "message": "go", **body}, headers=caller)
    assert response.status_code == 202, response.text
    return response.json()  # type: ignore[no-any-return]


def test_text_deltas_come_before_the_message_and_add_up_to_it(served: tuple[str, Threads]) -> None:
    base, _ = served
    started = start(base, ALICE, thread_id="chat-1")
    url = f"{base}/v1/threads/chat-1/events"
    with httpx.stream("GET", url, headers=ALICE, timeout=30) as response:
        seen = until_run_ends(response, started["run_id"])
    deltas = [f for f in seen if f.event == "text_delta"]
    [message] = [f for f in seen if f.event == "message" and f.data["payload"]["role"] == "assistant"]
    assert len(deltas) >= 3 and seen.index(deltas[-1]) < seen.index(message)
    assert all(f.id is None for f in deltas) and all(f.id is not None for f in seen if f.event == "message")
    assert "".join(f.data["text"] for f in deltas) == message.data["payload"]["text"] == REPLY
    # Ids as the caller knows them (alice's chosen thread and run ids are stored tenant-scoped).
    assert {f.data["run_id"] for f in deltas} == {started["run_id"]}
    assert [f.data["seq"] for f in deltas] == list(range(1, len(deltas) + 1))


def test_a_reconnect_gets_the_rest_and_the_step_in_progress_from_its_start(served: tuple[str, Threads]) -> None:
    base, _ = served
    started = start(base, ALICE, thread_id="chat-2")
    url = f"{base}/v1/threads/chat-2/events"
    last_id = 0
    with httpx.stream("GET", url, headers=ALICE, timeout=30) as response:
        got = 0
        for frame in frames(response):
            if frame.id is not None:
                last_id = frame.id
            if frame.event == "text_delta":
                got += 1
                if got == 3:
                    break
    with httpx.stream("GET", url, headers={**ALICE, "Last-Event-ID": str(last_id)}, timeout=30) as response:
        seen = until_run_ends(response, started["run_id"])
    committed = [f.id for f in seen if f.id is not None]
    assert committed and committed[0] == last_id + 1 and committed == sorted(committed)
    deltas = [f for f in seen if f.event == "text_delta"]
    assert deltas and deltas[0].data["seq"] == 1, "the step in progress comes again from its start"
    assert "".join(f.data["text"] for f in deltas) == REPLY


def test_another_tenants_thread_of_the_same_name_gets_no_delta(served: tuple[str, Threads]) -> None:
    base, threads = served
    bob = start(base, BOB, thread_id="shared-name")
    threads.wait(bob["run_id"], 30)
    bob_frames: list[Frame] = []
    with httpx.stream("GET", f"{base}/v1/threads/shared-name/events", headers=BOB, timeout=30) as response:

        def reader() -> None:
            with contextlib.suppress(Exception):  # the stream is closed under it at the end
                bob_frames.extend(frames(response))

        threading.Thread(target=reader, daemon=True).start()
        eventually(lambda: any(f.data.get("run_id") == bob["run_id"] for f in bob_frames), timeout=10, what="replay")
        alice = start(base, ALICE, thread_id="shared-name")
        threads.wait(alice["run_id"], 30)
        # Bob's stream is live: his own next run's deltas reach it.
        again = start(base, BOB, thread_id="shared-name")
        eventually(
            lambda: any(f.event == "text_delta" and f.data["run_id"] == again["run_id"] for f in bob_frames),
            timeout=30,
            what="bob's own deltas",
        )
        threads.wait(again["run_id"], 30)
    assert not [f for f in bob_frames if f.data.get("run_id") == alice["run_id"]]
    assert {f.data["run_id"] for f in bob_frames if f.event.endswith("_delta")} == {again["run_id"]}


def test_a_client_that_disconnects_mid_stream_leaves_no_subscription(served: tuple[str, Threads]) -> None:
    base, threads = served
    hub = threads.live_hub
    before = threading.active_count()
    started = start(base, ALICE, thread_id="chat-3")
    with httpx.stream("GET", f"{base}/v1/threads/chat-3/events", headers=ALICE, timeout=30) as response:
        for frame in frames(response):
            if frame.event == "text_delta":
                assert hub.subscriber_count >= 1
                break
    eventually(
        lambda: hub.subscriber_count == 0 and hub.channel_count == 0,
        timeout=10,
        what="the subscription removed",
        detail=lambda: (hub.subscriber_count, hub.channel_count),
    )
    threads.wait(started["run_id"], 30)
    assert threading.active_count() <= before + 1
