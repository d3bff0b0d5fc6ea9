"""The publisher's own producers on Redis (threads_celery.transitions.held_producers).

They must send exactly what Celery's producer pool sends (the task message, its queue and
priority, and the ``task-sent`` event Flower reads), with one Redis client per channel instead
of one per command, from any number of threads, after a fork, and after a failed send.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery._state import _task_stack

from tests.support.waiting import eventually
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.transitions import held_producers
from threads_celery.transitions.held_producers import HeldClientChannel, ProducerStack
from threads_celery.transitions.publishing import Publisher, celery_app, routes_by_queue_only
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def entry(key: str, task: str = TOOL_TASK) -> OutboxEntry:
    return OutboxEntry(key=key, task=task, args=(key,), argsrepr=f"noop [{key}]")


#: The token a tool call's task id adds to its effect key, fresh to each publish (publishing.task_id).
PUBLISH_TOKEN = re.compile(r"~[0-9a-f]{8}")


def key_of(task_id: str) -> str:
    """The outbox key a task id was made from (a tool call's id adds a token of its publish)."""
    return PUBLISH_TOKEN.sub("", task_id)


def queued(broker: redis.Redis) -> list[dict[str, Any]]:
    """Every task message on the work queue (all priority levels), oldest first."""
    messages: list[dict[str, Any]] = []
    for name in sorted(k.decode() for k in broker.keys("threads*")):
        if broker.type(name) == b"list":
            messages.extend(json.loads(raw) for raw in reversed(broker.lrange(name, 0, -1)))
    return messages


def comparable(message: dict[str, Any], name: str) -> str:
    """A task message as text, its body decoded, ``name`` (in its id) written as ``NAME``, and
    without what differs between any two sends (kombu's delivery tag, a tool call's publish token)."""
    decoded = {**message, "body": json.loads(base64.b64decode(message["body"]))}
    decoded["properties"] = {k: v for k, v in message["properties"].items() if k != "delivery_tag"}
    return PUBLISH_TOKEN.sub("~TOKEN", json.dumps(decoded, sort_keys=True).replace(name, "NAME"))


@pytest.mark.parametrize(
    ("url", "serves"),
    [
        ("redis://127.0.0.1:6379/3", True),
        ("rediss://:pw@cache.example:6380/0", True),
        ("redis://a:6379/0;redis://b:6379/0", True),
        ("sentinel://a:26379;sentinel://b:26379", False),
        ("redis://a:6379/0;amqp://guest@b//", False),
        ("amqp://guest:guest@127.0.0.1:5672//", False),
        ("memory://", False),
        ("", False),
    ],
)
def test_only_plain_redis_urls_get_held_producers(url: str, serves: bool) -> None:
    assert held_producers.serves(url) is serves


class SendTask:
    """What ``app.send_task`` sends for an entry, as the publisher would call it: the reference."""

    def __init__(self, app: Any) -> None:
        self.publisher = Publisher(app)

    def send(self, sent: OutboxEntry) -> None:
        self.publisher._send_task(sent, self.publisher._options(sent))


@pytest.mark.parametrize("path", ["held", "pooled"])
def test_a_send_is_the_message_and_event_send_task_sends(broker: redis.Redis, redis_url: str, path: str) -> None:
    # held: the publisher's own producers on Redis; pooled: Celery's producer pool, as for any
    # other broker (and after a held batch failed).
    app = celery_app(Settings(task_events=True), broker_url=redis_url)  # task-sent events on (THREADS_TASK_EVENTS)
    held, stock = Publisher(app), SendTask(app)
    assert held._producers is not None
    if path == "pooled":
        held._producers = None
    events = broker.pubsub()
    events.psubscribe("*celeryev*")
    eventually(lambda: events.get_message(timeout=0.1) is not None, timeout=5, what="the subscription")
    try:
        for publisher, key in ((stock, "tool:stock"), (held, "tool:held")):
            publisher.send(entry(key))
            publisher.send(entry(key.replace("tool", "step"), task=STEP_TASK))
        sent: list[dict[str, Any]] = []

        def four_events() -> bool:
            message = events.get_message(timeout=0.1)
            if message is not None and message["type"] == "pmessage":
                envelope = json.loads(message["data"])
                sent.append(json.loads(base64.b64decode(envelope["body"])))
            return len(sent) >= 4

        eventually(four_events, timeout=10, what="four task-sent events")
    finally:
        events.close()
        held.close()
    messages = {key_of(m["headers"]["id"]): m for m in queued(broker)}
    assert set(messages) == {"tool:stock", "step:stock", "tool:held", "step:held"}
    for kind in ("tool", "step"):
        held_message, stock_message = messages[f"{kind}:held"], messages[f"{kind}:stock"]
        assert comparable(held_message, "held") == comparable(stock_message, "stock")
    assert messages["tool:held"]["properties"]["priority"] is not None  # work's priority on Redis
    # Each send also published its task-sent event (what Flower shows before a worker has the task).
    assert sorted((e["type"], key_of(e["uuid"])) for e in sent) == [
        ("task-sent", key) for key in sorted(["step:held", "step:stock", "tool:held", "tool:stock"])
    ]


@pytest.mark.parametrize("path", ["held", "pooled"])
def test_a_send_from_inside_a_task_names_it_as_its_parent_as_send_task_does(
    broker: redis.Redis, redis_url: str, path: str
) -> None:
    app = celery_app(Settings(), broker_url=redis_url)

    @app.task(name="tests.parent", shared=False)
    def parent() -> None:
        """The task whose run publishes (a step publishing its calls)."""

    held, stock = Publisher(app), SendTask(app)
    if path == "pooled":
        held._producers = None
    parent.push_request(id="parent-1", root_id="root-1", called_directly=False)
    _task_stack.push(parent)
    try:
        for publisher, key in ((stock, "tool:stock"), (held, "tool:held")):
            publisher.send(entry(key))
    finally:
        _task_stack.pop()
        parent.pop_request()
        held.close()
    messages = {key_of(m["headers"]["id"]): m for m in queued(broker)}
    assert comparable(messages["tool:held"], "held") == comparable(messages["tool:stock"], "stock")
    assert (messages["tool:held"]["headers"]["parent_id"], messages["tool:held"]["headers"]["root_id"]) == (
        "parent-1",
        "root-1",
    )


def test_a_channel_builds_one_client_for_many_sends(
    broker: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    original = redis.Redis.__init__

    def counting_init(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    app = celery_app(Settings(), broker_url=redis_url)
    publisher = Publisher(app)
    publisher.send(entry("tool:warm"))  # the connection, its channel and its one client
    monkeypatch.setattr(redis.Redis, "__init__", counting_init)
    for i in range(50):
        publisher.send(entry(f"tool:{i}"))
    assert built == []
    monkeypatch.undo()
    stock = Publisher(app)
    stock._producers = None
    stock.send(entry("tool:stock-warm"))
    monkeypatch.setattr(redis.Redis, "__init__", counting_init)
    for i in range(5):
        stock.send(entry(f"tool:stock-{i}"))
    assert len(built) >= 5  # what kombu's own channel does: a client per command (a publish each)
    monkeypatch.undo()
    publisher.close()
    assert len(queued(broker)) == 57


def test_a_client_is_built_again_when_its_channels_pool_is_replaced(redis_url: str) -> None:
    app = celery_app(Settings(), broker_url=redis_url)
    stack = ProducerStack(app)
    held = stack.take()
    try:
        channel = held[0].default_channel
        assert isinstance(channel, HeldClientChannel)
        first = channel._create_client()
        assert channel._create_client() is first
        channel._pool = None  # what kombu does when it drops the channel's pools
        again = channel._create_client()
        assert again is not first and again.connection_pool is channel.pool
    finally:
        stack.discard(held)


def test_threads_publishing_at_once_each_take_a_producer(broker: redis.Redis, redis_url: str) -> None:
    app = celery_app(Settings(), broker_url=redis_url)
    publisher = Publisher(app)
    start = threading.Barrier(8)

    def publish(n: int) -> None:
        start.wait()
        for i in range(25):
            publisher.send(entry(f"tool:{n}:{i}"))

    workers = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert publisher._producers is not None
    idle = len(publisher._producers._idle)
    publisher.close()
    ids = sorted(key_of(m["headers"]["id"]) for m in queued(broker))
    assert ids == sorted(f"tool:{n}:{i}" for n in range(8) for i in range(25))
    assert 1 <= idle <= 8  # one per thread at most, kept for the next sends
    assert publisher._producers._idle == []


def test_a_failed_send_discards_its_producer(redis_url: str) -> None:
    app = celery_app(Settings(), broker_url="redis://127.0.0.1:1/0")  # nothing listens there
    publisher = Publisher(app)
    assert publisher._producers is not None
    with pytest.raises(Exception):  # noqa: B017 - kombu's OperationalError, whatever wraps it
        publisher.send(entry("tool:lost"))
    assert publisher._producers._idle == []
    publisher([entry("tool:lost")])  # the outbox row is the retry: logged, not raised
    publisher.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_publishes_on_connections_of_its_own(broker: redis.Redis, redis_url: str) -> None:
    app = celery_app(Settings(), broker_url=redis_url)
    publisher = Publisher(app)
    publisher.send(entry("tool:parent-1"))
    assert publisher._producers is not None
    parents = list(publisher._producers._idle)
    pid = os.fork()
    if pid == 0:  # the child: publish, close, and leave the parent's connection alone
        code = 0
        try:
            publisher.send(entry("tool:child"))
            assert publisher._producers._idle and publisher._producers._idle[0] is not parents[0]
            publisher.close()
        except BaseException:  # noqa: BLE001 - any failure is the child's exit status
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert publisher._producers._idle == parents
    publisher.send(entry("tool:parent-2"))  # the parent's connection still works
    publisher.close()
    assert sorted(key_of(m["headers"]["id"]) for m in queued(broker)) == [
        "tool:child",
        "tool:parent-1",
        "tool:parent-2",
    ]


def test_sends_routed_by_queue_name_skip_declaring_and_a_users_route_keeps_it(
    broker: redis.Redis, redis_url: str
) -> None:
    ours = celery_app(Settings(), broker_url=redis_url)
    assert routes_by_queue_only(ours)
    publisher = Publisher(ours)
    publisher.send(entry("tool:ours"))
    publisher.close()
    assert broker.keys("_kombu.binding*") == []  # nothing declared, and the message is queued:
    assert [key_of(m["headers"]["id"]) for m in queued(broker)] == ["tool:ours"]
    broker.flushdb()

    # A route of the user's that names an exchange: the send keeps Celery's declaring (Celery
    # declares and binds the queue, as without held producers), and the message gets there.
    routes = {"threads.tool": {"queue": "threads", "exchange": "threads", "routing_key": "threads"}}
    theirs = celery_app(Settings(extra_celery={"task_routes": routes}), broker_url=redis_url)
    assert not routes_by_queue_only(theirs)
    publisher = Publisher(theirs)
    assert publisher._declare == {} and Publisher(ours)._declare == {"declare": []}
    publisher.send(entry("tool:theirs"))
    publisher.close()
    assert [key_of(m["headers"]["id"]) for m in queued(broker)] == ["tool:theirs"]


@pytest.mark.parametrize("task_events", [False, True], ids=["events-off", "events-on"])
def test_entries_published_together_go_in_one_round_trip(
    broker: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, task_events: bool
) -> None:
    app = celery_app(Settings(task_events=task_events), broker_url=redis_url)
    publisher = Publisher(app)
    publisher([entry("tool:warm")])
    executed: list[int] = []
    original = redis.client.Pipeline.execute

    def counting_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        executed.append(len(self.command_stack))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting_execute)
    publisher([entry(f"tool:{i}") for i in range(3)])
    monkeypatch.undo()
    publisher.close()
    # Three task messages (and, with task events, their three task-sent events) in one pipeline.
    assert executed == [6 if task_events else 3]
    assert sorted(key_of(m["headers"]["id"]) for m in queued(broker)) == ["tool:0", "tool:1", "tool:2", "tool:warm"]


def test_a_failed_batch_is_sent_again_one_by_one_through_celerys_pool(
    broker: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from kombu.transport.redis import PublishBatch

    app = celery_app(Settings(), broker_url=redis_url)
    publisher = Publisher(app)

    def broken_flush(self: Any) -> None:
        raise ConnectionError("the broker went away mid-batch")

    monkeypatch.setattr(PublishBatch, "flush", broken_flush)
    caplog.set_level("INFO", logger="threads_celery.transitions.publishing")
    publisher([entry("tool:a"), entry("tool:b")])
    publisher.send(entry("tool:c"))
    monkeypatch.undo()
    assert publisher._producers is not None and publisher._producers._idle == []  # both dropped
    assert sorted(key_of(m["headers"]["id"]) for m in queued(broker)) == ["tool:a", "tool:b", "tool:c"]
    assert "sending them one by one" in caplog.text and "left for the reconcile backbone" not in caplog.text
    publisher.close()
