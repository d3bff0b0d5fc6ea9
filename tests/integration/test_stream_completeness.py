"""Stream completeness (issue 44): every SSE client of ``GET /v1/threads/{id}/events`` either
has the whole text of each model step from its deltas, or is told it has not.

A real ``threads-celery api`` process serves 100 concurrent SSE clients (plain asyncio sockets)
on the threads of runs started through ``POST /v1/runs`` and carried out by a real worker
(``celery -A tasks worker``), on Redis and on RabbitMQ. The model (``tail_writer``) streams many
small fragments and its turn ends right after the last one. One client reads so slowly (a tiny
receive buffer, nothing read while a long reply streams) that the API drops its deltas.

For every client and every run, at the run's assistant ``message`` frame:

- the client saw, before it, ``step_end`` for the attempt it built, the deltas numbered 1 to
  that ``step_end``'s ``last_seq`` without a gap, and no ``resync``: then its deltas, joined in
  ``seq`` order, are the message's text;
- or it was told: a ``resync``, a ``step_void``, a ``seq`` gap or a ``step_end`` naming a
  ``seq`` it did not get. Then the message (which it got) is the text to show.

No client may get deltas of a run's step after the run's message. ``THREADS_TEST_STREAM_ROUNDS``
(default 2) sets how many runs each thread gets one after the other.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.private_services import PrivateRedis
from tests.support.processes import THREADS_CELERY, ManagedProcess, WorkerProcess, free_port, subprocess_env
from tests.support.rabbitmq import rabbitmq_vhost
from tests.support.services import require_service
from tests.support.waiting import Deadline

TOKEN = "stream-complete-token-0123456789"
AGENTS = "tests.integration.stream_tail_agents"
ROUNDS = int(os.environ.get("THREADS_TEST_STREAM_ROUNDS", "2"))
#: Threads with tail_writer runs, and their clients; the slow reader's thread has 3 (100 in all).
TAIL_THREADS = 10
TAIL_CLIENTS = 97
DEADLINE_S = 90.0


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of the module's own (no other suite's worker takes its tasks), or a
    RabbitMQ vhost of its own."""
    if request.param == "rabbitmq":
        with rabbitmq_vhost("threads-complete") as url:
            yield url
        return
    reason = PrivateRedis.available()
    require_service("redis-server", reason is None, reason or "", address="a private instance")
    with PrivateRedis(log_dir=tmp_path_factory.mktemp("complete-redis")) as server:
        yield server.url(0)


@pytest.fixture(scope="module")
def api_url(broker_url: str, migrated_pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A worker and an API process on the module's ledger and broker; the API's URL."""
    logs = tmp_path_factory.mktemp("complete")
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": broker_url,
            "THREADS_AGENTS": AGENTS,
            "THREADS_API_TOKENS": TOKEN,
            # Each fragment of the long reply is a message of its own (so that the slow reader
            # falls 1,000 messages behind within seconds); the tail writer's still share some.
            "THREADS_LIVE_COALESCE_MS": "1",
        }
    )
    name = "complete-" + broker_url.split(":", 1)[0]
    worker = WorkerProcess(name, env=env, log_path=logs / f"{name}.log", concurrency=4)
    port = free_port()
    api = ManagedProcess(
        "api", [THREADS_CELERY, "api", "--port", str(port), "-l", "warning"], env=env, log_path=logs / "api.log"
    )
    url = f"http://127.0.0.1:{port}"
    with worker.running(60):
        api.start()
        try:
            api.wait_until(lambda: _ready(url), "the API", "ready with a worker", timeout=60, interval=0.2)
            yield url
        finally:
            api.terminate()
            print(f"--- last lines of the API's log ---\n{api.log_tail(40)}")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz?worker=1", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@dataclass
class Frame:
    event: str
    data: dict[str, Any]


@dataclass
class Client:
    """One SSE client: every frame it got, in order."""

    thread_id: str
    slow: bool = False
    frames: list[Frame] = field(default_factory=list)
    done: set[str] = field(default_factory=set)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes | None:
    """The next chunk of a chunked HTTP body; None at its end."""
    size_line = await reader.readline()
    if not size_line:
        return None
    size = int(size_line.split(b";")[0].strip() or b"0", 16)
    if size == 0:
        return None
    data = await reader.readexactly(size)
    await reader.readexactly(2)
    return data


async def follow(url: str, client: Client, runs: int, resume: asyncio.Event, connected: asyncio.Event) -> None:
    """Read the client's stream until ``runs`` runs of its thread have completed. A slow client,
    with a small receive buffer, reads nothing after its first delta until ``resume`` is set."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if client.slow:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    # A slow client's reader stops taking bytes from its socket past 16 KB.
    reader, writer = await asyncio.open_connection(sock=sock, limit=8192 if client.slow else 1 << 22)
    writer.write(
        f"GET /v1/threads/{client.thread_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower(), head
        connected.set()
        pending = b""
        while len(client.done) < runs:
            chunk = await _read_chunked(reader)
            if chunk is None:
                raise AssertionError(f"the stream of {client.thread_id} ended")
            pending += chunk
            *whole, pending = pending.split(b"\n\n")
            for raw in whole:
                frame = _frame(raw)
                if frame is None:
                    continue
                client.frames.append(frame)
                if frame.event == "run" and frame.data["payload"].get("status") == "completed":
                    client.done.add(frame.data["run_id"])
                if client.slow and frame.event == "text_delta" and not resume.is_set():
                    await resume.wait()
    finally:
        writer.close()


def _frame(raw: bytes) -> Frame | None:
    fields: dict[str, str] = {}
    for line in raw.decode().split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")
    if "data" not in fields:
        return None
    return Frame(fields.get("event", "message"), json.loads(fields["data"]))


@dataclass
class Verdict:
    #: (client, run): the text was whole and the client knew it.
    whole: int = 0
    #: (client, run): the client was told it missed something (resync, void, gap, step_end).
    told: int = 0
    #: (client, run): it got no delta of the run (the message is all it has).
    no_deltas: int = 0
    #: The cases that break the promise, described.
    silent_losses: list[str] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    missing_message: list[str] = field(default_factory=list)
    #: The clients that got a resync.
    resynced_clients: set[int] = field(default_factory=set)


def judge(clients: list[Client], runs: dict[str, str]) -> Verdict:
    """Each client's view of each run (``runs``: run id -> its thread) against the run's message,
    built as a client would: a ``resync`` drops all partial text, a ``step_void`` the attempt's."""
    verdict = Verdict()
    for number, client in enumerate(clients):
        if any(frame.event == "resync" for frame in client.frames):
            verdict.resynced_clients.add(number)
        for run in [run for run, thread in runs.items() if thread == client.thread_id]:
            who = f"client {number} ({client.thread_id}{', slow' if client.slow else ''}) run {run}"
            seqs: dict[int, int] = {}  # attempt -> the last seq seen
            texts: dict[int, list[str]] = {}
            gaps: set[int] = set()
            ends: dict[int, int] = {}
            told = False
            message: str | None = None
            for frame in client.frames:
                data = frame.data
                if frame.event == "resync":
                    seqs, texts, gaps, ends, told = {}, {}, set(), {}, True
                    continue
                if data.get("run_id") != run:
                    continue
                if frame.event in ("text_delta", "thinking_delta", "tool_call_delta"):
                    if message is not None:
                        verdict.late.append(f"{who}: {frame.event} seq {data['seq']} after the message")
                        continue
                    attempt = data["attempt"]
                    if data["seq"] != seqs.get(attempt, 0) + 1:
                        gaps.add(attempt)
                    seqs[attempt] = data["seq"]
                    texts.setdefault(attempt, []).append(data.get("text", ""))
                elif frame.event == "step_void":
                    for attempt in [a for a in texts if a <= data["attempt"]]:
                        del texts[attempt]
                    told = True
                elif frame.event == "step_end":
                    ends[data["attempt"]] = data["last_seq"]
                elif frame.event == "message" and data["payload"].get("role") == "assistant" and message is None:
                    message = data["payload"]["text"]
                    if not texts:  # no partial text: the message is all it has
                        if told:
                            verdict.told += 1
                        else:
                            verdict.no_deltas += 1
                        continue
                    attempt = max(texts)
                    built = "".join(texts[attempt])
                    end = ends.get(attempt)
                    if attempt in gaps or (end is not None and end != seqs[attempt]):
                        verdict.told += 1
                    elif built != message:
                        verdict.silent_losses.append(
                            f"{who}: seq 1..{seqs[attempt]} without a gap, step_end "
                            f"{'absent' if end is None else end}, no resync, yet {len(message) - len(built)} "
                            f"of {len(message)} characters missing (ends {built[-12:]!r}, "
                            f"the message {message[-12:]!r})"
                        )
                    elif end is None:
                        verdict.unmarked.append(f"{who}: deltas 1..{seqs[attempt]} and no step_end before the message")
                    else:
                        verdict.whole += 1
            if message is None:
                verdict.missing_message.append(who)
    return verdict


async def scenario(url: str) -> tuple[list[Client], dict[str, str]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    tag = os.urandom(4).hex()
    tail_threads = [f"complete-{tag}-{i}" for i in range(TAIL_THREADS)]
    long_thread = f"complete-{tag}-long"
    runs: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:

        async def start(agent: str, thread_id: str) -> str:
            response = await http.post("/v1/runs", json={"agent": agent, "message": "go", "thread_id": thread_id})
            assert response.status_code == 202, response.text
            run_id: str = response.json()["run_id"]
            runs[run_id] = thread_id
            return run_id

        async def completed(run_id: str) -> None:
            deadline = Deadline(DEADLINE_S)
            while (await http.get(f"/v1/runs/{run_id}")).json()["status"] != "completed":
                deadline.check(f"run {run_id} completed")
                await asyncio.sleep(0.05)

        # Each thread's first run makes the thread, before anyone subscribes to it; the clients
        # then get that run's events from the thread's start.
        first = [await start("tail_writer", t) for t in tail_threads] + [await start("long_writer", long_thread)]
        await asyncio.gather(*(completed(run) for run in first))
        clients = [Client(tail_threads[i % TAIL_THREADS]) for i in range(TAIL_CLIENTS)]
        clients += [Client(long_thread, slow=True), Client(long_thread), Client(long_thread)]
        resume = asyncio.Event()
        connected = [asyncio.Event() for _ in clients]
        tasks = [
            asyncio.create_task(follow(url, c, 2 if c.thread_id == long_thread else 1 + ROUNDS, resume, up))
            for c, up in zip(clients, connected, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in connected)), DEADLINE_S)
        long_run = await start("long_writer", long_thread)
        for _ in range(ROUNDS):
            started = [await start("tail_writer", t) for t in tail_threads]
            await asyncio.gather(*(completed(run) for run in started))
        await completed(long_run)
        resume.set()
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
    return clients, runs


def test_every_client_has_each_steps_whole_text_or_is_told(api_url: str) -> None:
    clients, runs = asyncio.run(scenario(api_url))
    verdict = judge(clients, runs)
    print(
        f"{len(clients)} clients, {len(runs)} runs: {verdict.whole} views whole and marked, {verdict.told} told "
        f"(resynced clients: {sorted(verdict.resynced_clients)}), {len(verdict.silent_losses)} silent losses, "
        f"{len(verdict.unmarked)} without step_end, {verdict.no_deltas} without deltas"
    )
    slow_frames = [f.event for c in clients if c.slow for f in c.frames]
    print(f"the slow reader: {len(slow_frames)} frames, {slow_frames.count('text_delta')} deltas")
    assert not verdict.missing_message, verdict.missing_message[:5]
    assert not verdict.silent_losses, f"{len(verdict.silent_losses)} silent losses:\n" + "\n".join(
        verdict.silent_losses[:20]
    )
    assert not verdict.late, verdict.late[:10]
    assert not verdict.unmarked, f"{len(verdict.unmarked)} views without step_end:\n" + "\n".join(verdict.unmarked[:5])
    slow = next(i for i, c in enumerate(clients) if c.slow)
    assert slow in verdict.resynced_clients, "the slow reader was never told it fell behind"
    # Not vacuous: most views were whole (each fast client of a tail_writer thread, each round).
    assert verdict.whole >= TAIL_CLIENTS * ROUNDS // 2, verdict.whole
