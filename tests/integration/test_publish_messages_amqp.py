"""On RabbitMQ the publisher sends what ``app.send_task`` would: the same message, to the same
queue, declared as Celery declares it (a quorum queue by default)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection

from tests.support.rabbitmq import rabbitmq_vhost
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.transitions.publishing import Publisher, celery_app
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK

pytestmark = pytest.mark.integration


@pytest.fixture
def amqp_url() -> Iterator[str]:
    with rabbitmq_vhost("threads-publish") as url:
        yield url


#: The token a tool call's task id adds to its effect key, fresh to each publish (publishing.task_id).
PUBLISH_TOKEN = re.compile(r"~[0-9a-f]{8}")


def comparable(message: Any, name: str) -> str:
    """A received message as text, ``name`` (in its id) written as ``NAME``, without the fields
    that differ between any two deliveries (a tool call's publish token among them)."""
    properties = {k: v for k, v in message.properties.items() if k not in ("delivery_tag", "application_headers")}
    headers = dict(message.properties.get("application_headers") or {})
    seen = {"headers": headers, "properties": properties, "body": json.loads(message.body)}
    return PUBLISH_TOKEN.sub("~TOKEN", json.dumps(seen, sort_keys=True, default=str).replace(name, "NAME"))


@pytest.mark.parametrize("task", [TOOL_TASK, STEP_TASK])
def test_a_send_on_rabbitmq_is_the_message_send_task_sends(amqp_url: str, task: str) -> None:
    app = celery_app(Settings(), broker_url=amqp_url)
    ours = Publisher(app)
    assert ours._producers is None  # Celery's producer pool: held producers are Redis's
    for name in ("ours", "stock"):  # ours first: it declares the queue, as Celery would
        sent = OutboxEntry(key=f"key:{name}", task=task, args=(f"key:{name}",), argsrepr=f"noop [{name}]")
        if name == "stock":
            ours._send_task(sent, ours._options(sent))
        else:
            ours.send(sent)
    with Connection(amqp_url) as conn:
        channel = conn.default_channel
        got = {}
        for _ in range(2):
            message = channel.basic_get(queue=app.conf.task_default_queue, no_ack=True)
            assert message is not None, "a message did not reach the work queue"
            got[PUBLISH_TOKEN.sub("", message.properties["application_headers"]["id"])] = message
    assert comparable(got["key:ours"], "ours") == comparable(got["key:stock"], "stock")
