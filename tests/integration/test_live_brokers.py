"""Live deltas from a real prefork worker, over each broker the project supports: the broker's
Redis (pub/sub and a replay list) and RabbitMQ (a fanout exchange). ``threads.stream`` gets the
reply in several deltas before its message commits; the API's event stream, reconnected with
Last-Event-ID in the middle of the step, gets the step again from its start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.integration.live_agents import ALL_AGENTS, REPLY
from tests.support.processes import WorkerProcess, subprocess_env
from tests.support.rabbitmq import rabbitmq_vhost
from threads_celery import Threads
from threads_celery.api.app import create_api
from threads_celery.live import Committed, TextDelta

TOKEN = "live-brokers-token-0123456789"


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, integration_redis_url: str) -> Iterator[str]:
    """The module's Redis database, or a RabbitMQ vhost of the module's own."""
    if request.param == "rabbitmq":
        with rabbitmq_vhost("threads-live") as url:
            yield url
        return
    yield integration_redis_url


@pytest.fixture(scope="module")
def live(broker_url: str, migrated_pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": broker_url,
            "THREADS_AGENTS": "tests.integration.live_agents",
        }
    )
    name = "live-" + broker_url.split(":", 1)[0]
    worker = WorkerProcess(name, env=env, log_path=tmp_path_factory.mktemp("live") / f"{name}.log", concurrency=2)
    worker.start()
    client = Threads(database_url=migrated_pg_url, broker_url=broker_url)
    try:
        worker.wait_ready(60)
        for agent in ALL_AGENTS:
            client.register(agent)
        yield client
    finally:
        client.close()
        worker.terminate()


def test_stream_gets_the_reply_in_deltas_before_its_message(live: Threads) -> None:
    handle = live.start("live_writer", "go")
    events = list(live.stream(handle.run_id))
    [message] = [
        e for e in events if isinstance(e, Committed) and e.type == "message" and e.payload["role"] == "assistant"
    ]
    before = [e for e in events[: events.index(message)] if isinstance(e, TextDelta)]
    assert len(before) >= 3
    assert "".join(d.text for d in before) == message.payload["text"] == REPLY
    assert [d.seq for d in before] == list(range(1, len(before) + 1))


def _frames(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any], int | None]]:
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:
            yield fields.get("event", ""), json.loads(fields["data"]), int(fields["id"]) if "id" in fields else None
        fields = {}


def test_the_event_stream_resumes_mid_step_with_the_step_from_its_start(live: Threads) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_api(live, tokens={TOKEN}, keepalive_s=0.2)) as http:
        started = http.post("/v1/runs", json={"agent": "live_writer", "message": "go"}, headers=auth).json()
        url = f"/v1/threads/{started['thread_id']}/events"
        last_id, seen = 0, 0
        with http.stream("GET", url, headers=auth) as response:
            for event, _, frame_id in _frames(response.iter_lines()):
                last_id = frame_id if frame_id is not None else last_id
                seen += event == "text_delta"
                if seen == 4:
                    break
        texts: list[str] = []
        first_seq = None
        with http.stream("GET", url, headers={**auth, "Last-Event-ID": str(last_id)}) as response:
            for event, data, frame_id in _frames(response.iter_lines()):
                assert frame_id is None or frame_id > last_id
                if event == "text_delta":
                    first_seq = data["seq"] if first_seq is None else first_seq
                    texts.append(data["text"])
                if event == "run" and data["payload"]["status"] == "completed":
                    break
    assert first_seq == 1
    assert "".join(texts) == REPLY
