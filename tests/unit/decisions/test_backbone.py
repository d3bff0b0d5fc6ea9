"""The backbone's own queue: routing of control and work tasks, queue names, tick coverage.

Pure functions first, then the Celery configuration and the publisher that apply them (no broker:
what the publisher hands Celery is recorded). The proof on a real worker with a backlog is
``tests/integration/test_control_queue.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.publishes import record_publishes
from threads_celery import Agent, ConfigError, tool
from threads_celery.decisions.backbone import (
    CONTROL_QUEUE,
    CONTROL_TASKS,
    DELIVER_TASK,
    RECONCILE_TASK,
    SCHEDULED_RUN_TASK,
    WORK_QUEUE,
    check_queue_name,
    queue_for,
    tick_is_covered,
)
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.testing import ScriptedModel
from threads_celery.transitions.publishing import Publisher
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK
from threads_celery.worker.application import consume_control_queue, create_app


class Empty(BaseModel):
    pass


def test_control_tasks_take_the_control_queue_whatever_was_asked() -> None:
    assert CONTROL_QUEUE == "threads.control"
    for task in (RECONCILE_TASK, DELIVER_TASK, SCHEDULED_RUN_TASK):
        assert task in CONTROL_TASKS
        assert queue_for(task, None, work_queue=None, control_queue=CONTROL_QUEUE) == CONTROL_QUEUE
        assert queue_for(task, "email", work_queue=None, control_queue=CONTROL_QUEUE) == CONTROL_QUEUE
        assert queue_for(task, None, work_queue="solo", control_queue="solo.control") == "solo.control"


def test_work_takes_its_own_queue_or_the_default() -> None:
    assert queue_for(TOOL_TASK, "email", work_queue=None, control_queue=CONTROL_QUEUE) == "email"
    assert queue_for(STEP_TASK, None, work_queue=None, control_queue=CONTROL_QUEUE) is None
    # The embedded worker consumes one work queue: work goes there whatever it asked for.
    assert queue_for(TOOL_TASK, "email", work_queue="solo", control_queue="solo.control") == "solo"


@pytest.mark.parametrize(
    ("queue", "refused"),
    [(None, None), ("email", None), ("", "non-empty"), ("  ", "non-empty"), (3, "non-empty"),
     ("threads.control", "reserved"), ("mine.control", "reserved")],
)  # fmt: skip
def test_queue_names(queue: object, refused: str | None) -> None:
    reason = check_queue_name("tool 'x'", queue)
    assert (reason is None) if refused is None else (reason is not None and refused in reason)


def test_a_tick_is_skipped_only_when_a_later_tick_started() -> None:
    assert tick_is_covered(100.0, 100.5)  # a tick started after this one was published
    assert tick_is_covered(100.0, 100.0)
    assert not tick_is_covered(100.0, 99.9)  # the last tick started before: this one runs
    assert not tick_is_covered(None, 100.0)  # no publish time: always runs
    assert not tick_is_covered(100.0, None)  # no tick yet in this process


def test_agents_and_tools_name_their_queue_but_never_a_control_queue() -> None:
    slow = tool(
        name="slow",
        description="d",
        input=Empty,
        execute=lambda i, c: "ok",
        effect="read_only",
        queue="slow",
    )
    agent = Agent(name="routed", instructions="i", model=ScriptedModel([]), tools=[slow], queue="agents")
    assert agent.queue == "agents" and slow.queue == "slow"
    assert agent.describe()["queue"] == "agents"
    assert Agent(name="plain", instructions="i", model=ScriptedModel([])).queue is None
    with pytest.raises(ConfigError, match="reserved"):
        Agent(name="bad", instructions="i", model=ScriptedModel([]), queue="threads.control")
    with pytest.raises(ConfigError, match="reserved"):
        tool(
            name="bad",
            description="d",
            input=Empty,
            execute=lambda i, c: "ok",
            queue="threads.control",
        )

    class Subclassed(Agent):
        name = "subclassed"
        instructions = "i"
        model = ScriptedModel([])
        queue = "batch"

    assert Subclassed().queue == "batch"


def test_the_queue_is_not_part_of_the_thread_pin() -> None:
    a = Agent(name="same", instructions="i", model=ScriptedModel([]))
    b = Agent(name="same", instructions="i", model=ScriptedModel([]), queue="elsewhere")
    assert a.config_hash() == b.config_hash()  # moving an agent to another queue keeps its threads


def _app() -> Any:
    return create_app(Settings(), AgentRegistry(), broker_url="redis://127.0.0.1:1/0")


def test_the_celery_configuration_declares_both_queues_and_routes_control() -> None:
    app = _app()
    assert app.conf.task_default_queue == WORK_QUEUE
    assert [q.name for q in app.conf.task_queues] == [WORK_QUEUE, CONTROL_QUEUE]
    for task in CONTROL_TASKS:
        assert app.amqp.router.route({}, task)["queue"].name == CONTROL_QUEUE
    assert app.amqp.router.route({}, STEP_TASK)["queue"].name == WORK_QUEUE
    tick = app.conf.beat_schedule["threads-reconcile"]
    assert tick["options"] == {"queue": CONTROL_QUEUE}  # no expires: a late tick is never dropped unseen


def test_a_worker_given_other_queues_still_consumes_the_control_queue() -> None:
    app = _app()
    app.amqp.queues.select("email")
    assert list(app.amqp.queues.consume_from) == ["email"]
    consume_control_queue(app)
    consume_control_queue(app)  # idempotent
    assert sorted(app.amqp.queues.consume_from) == ["email", CONTROL_QUEUE]


def test_the_publisher_keeps_control_on_its_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app()
    sent = record_publishes(monkeypatch, app)
    publisher = Publisher(app)
    publisher([
        OutboxEntry(key="deliver:r:completed", task=DELIVER_TASK, args=("r", "completed"), queue="email"),
        OutboxEntry(key="r:0:0", task=TOOL_TASK, args=("r:0:0",), queue="email"),
        OutboxEntry(key="step:r:1", task=STEP_TASK, args=("r", 1)),
    ])  # fmt: skip
    assert [(name, options.get("queue")) for name, options in sent] == [
        (DELIVER_TASK, CONTROL_QUEUE), (TOOL_TASK, "email"), (STEP_TASK, WORK_QUEUE)
    ]  # fmt: skip


def test_the_embedded_app_has_a_control_queue_of_its_own() -> None:
    app = create_app(Settings(), AgentRegistry(), broker_url="memory://")
    other = create_app(Settings(), AgentRegistry(), broker_url="memory://")
    work = app.conf.task_default_queue
    assert work.startswith("threads-embedded-") and work != other.conf.task_default_queue
    assert [q.name for q in app.conf.task_queues] == [work, work + ".control"]
    assert Publisher(app, single_queue=work).control_queue == work + ".control"


def test_an_agents_steps_carry_its_queue_and_the_embedded_worker_still_runs_them() -> None:
    from threads_celery import Threads
    from threads_celery.testing import say
    from threads_celery.transitions import runs as run_records

    routed = Agent(
        name="routed",
        instructions="i",
        model=ScriptedModel([say("done"), say("again")]),
        queue="agents",
    )
    with Threads.embedded(reconcile_interval=None) as threads:
        threads.register(routed)
        # A web app that starts a run by name reads the queue the agent's workers recorded.
        with threads.store.transaction() as tx:
            _, entries = run_records.submit_run(
                tx,
                agent="routed",
                config_hash=routed.config_hash(),
                message="hi",
                now=run_records.utcnow(),
            )
        assert [(e.task, e.queue) for e in entries] == [(STEP_TASK, "agents")]
        threads.publisher(entries)
        # The embedded worker consumes one work queue, so the routed run still completes there.
        handle = threads.start(routed, "hello")
        assert threads.wait(handle.run_id, timeout=30).status == "completed"


def test_moving_an_agent_to_another_queue_is_recorded_for_its_next_runs() -> None:
    from threads_celery import Threads
    from threads_celery.transitions import runs as run_records

    with Threads.embedded(reconcile_interval=None) as threads:
        threads.register(Agent(name="mover", instructions="i", model=ScriptedModel([])))
        threads.registry = AgentRegistry()  # a new deployment of the same agent, now routed
        threads.register(Agent(name="mover", instructions="i", model=ScriptedModel([]), queue="batch"))
        with threads.store.read() as tx:
            assert run_records.agent_queue(tx, "mover") == "batch"


def test_each_queue_is_bound_by_its_own_name_so_no_message_is_copied_into_the_other() -> None:
    app = _app()
    for queue in app.conf.task_queues:
        assert (queue.exchange.name, queue.routing_key) == (queue.name, queue.name)
    route = app.amqp.router.route({}, RECONCILE_TASK)
    assert (route["queue"].exchange.name, route["queue"].routing_key) == (CONTROL_QUEUE, CONTROL_QUEUE)
    app.amqp.queues.select("email")
    consume_control_queue(app)
    control = app.amqp.queues.consume_from[CONTROL_QUEUE]
    assert (control.exchange.name, control.routing_key) == (CONTROL_QUEUE, CONTROL_QUEUE)


def test_a_row_republished_again_and_again_backs_off_to_four_graces() -> None:
    from datetime import timedelta

    from threads_celery.decisions.backbone import republish_delay

    grace = timedelta(seconds=10)
    assert [republish_delay(grace, n).total_seconds() for n in range(6)] == [20, 40, 80, 160, 160, 160]
    assert republish_delay(grace, -1) == grace * 2  # a corrupt count is treated as the first


def test_the_store_spaces_the_republishes_of_a_row_nobody_consumes() -> None:
    from datetime import timedelta

    from sqlalchemy import select

    from threads_celery import Threads
    from threads_celery.decisions.backbone import republish_delay
    from threads_celery.store.schema import outbox
    from threads_celery.transitions.runs import utcnow

    with Threads.embedded(reconcile_interval=None) as threads:
        store = threads.store
        waiting = OutboxEntry(key="step:run_waiting:0", task=STEP_TASK, args=("run_waiting", 0))
        now = utcnow()
        with store.transaction() as tx:
            tx.insert_outbox(waiting, now - timedelta(hours=1))
        gaps = []
        for _ in range(3):
            with store.transaction() as tx:
                assert [e.key for e in tx.due_outbox(now=now, limit=10, republish_delay=republish_delay)] == [
                    waiting.key
                ]
                due_at = tx.conn.execute(select(outbox.c.due_at).where(outbox.c.key == waiting.key)).scalar_one()
            if due_at.tzinfo is None:
                due_at = due_at.replace(tzinfo=now.tzinfo)
            gaps.append(round((due_at - now) / store.step_grace))
            with store.transaction() as tx:  # not due before its time
                assert tx.due_outbox(now=now, limit=10, republish_delay=republish_delay) == []
            now = due_at
        assert gaps == [2, 4, 8]


def test_on_redis_control_and_recovered_work_are_published_ahead_of_waiting_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from threads_celery.decisions.backbone import URGENT_PRIORITY, WORK_PRIORITY, message_priority

    assert URGENT_PRIORITY < WORK_PRIORITY  # kombu's Redis transport serves lower numbers first
    assert message_priority(STEP_TASK, recovered=True, broker_url="redis://h/0") == URGENT_PRIORITY
    assert message_priority(TOOL_TASK, recovered=False, broker_url="rediss://h/0") == WORK_PRIORITY
    # Redis pops by priority across every queue a worker consumes: control must never be
    # below work, or a worker with a backlog would never reach a tick.
    for task in CONTROL_TASKS:
        assert message_priority(task, recovered=False, broker_url="redis://h/0") == URGENT_PRIORITY
    assert message_priority(STEP_TASK, recovered=True, broker_url="amqp://guest@h//") is None
    assert message_priority(RECONCILE_TASK, recovered=False, broker_url="memory://") is None

    app = _app()
    assert app.conf.task_default_priority == WORK_PRIORITY  # a task's own retry waits its turn
    for task in CONTROL_TASKS:  # what Beat sends with apply_async: by the route, as Celery 6 keeps it
        assert app.amqp.router.route({}, task)["priority"] == URGENT_PRIORITY
    sent = record_publishes(monkeypatch, app)
    Publisher(app)([
        OutboxEntry(key="step:r:1", task=STEP_TASK, args=("r", 1)),
        OutboxEntry(key="step:r:2", task=STEP_TASK, args=("r", 2), recovered=True),
        OutboxEntry(key="deliver:r:completed", task=DELIVER_TASK, args=("r", "completed")),
    ])  # fmt: skip
    assert [options["priority"] for _, options in sent] == [WORK_PRIORITY, URGENT_PRIORITY, URGENT_PRIORITY]


def test_a_republished_row_is_ordinary_work_not_urgent() -> None:
    from datetime import timedelta

    from threads_celery import Threads
    from threads_celery.transitions.runs import utcnow

    with Threads.embedded(reconcile_interval=None) as threads:
        runtime = threads.app.threads_runtime.get()
        published: list[OutboxEntry] = []
        runtime.publish = published.extend
        lost = OutboxEntry(key="step:run_lost:0", task=STEP_TASK, args=("run_lost", 0))
        with threads.store.transaction() as tx:
            tx.insert_outbox(lost, utcnow() - timedelta(hours=1))
        assert runtime.reconcile_tick()["republished"] == 1
        # Behind a backlog a due row is mostly waiting, not lost: an urgent copy of each would
        # flood the lane a dead worker's runs recover through (test_reconcile checks that lane).
        assert [(e.key, e.recovered) for e in published] == [(lost.key, False)]


def test_the_tasks_use_no_task_attribute_celery_6_drops() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = _app()
        app.finalize()
        assert set(CONTROL_TASKS) <= set(app.tasks)
    assert [str(w.message) for w in caught if "task attribute" in str(w.message)] == []


def test_steps_and_calls_show_their_agent_or_tool_by_shadow_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from threads_celery.transitions.runs import step_entry, tool_entry

    app = _app()
    sent = record_publishes(monkeypatch, app)
    Publisher(app)([
        step_entry("run_1", 0, "trip-planner"),
        tool_entry("run_1:0:0", "send_email", None),
        OutboxEntry(key="deliver:r:completed", task=DELIVER_TASK, args=("r", "completed")),
    ])  # fmt: skip
    assert [(name, options.get("shadow"), options["argsrepr"]) for name, options in sent] == [
        (STEP_TASK, "threads.step trip-planner", "('trip-planner' step 0, run run_1)"),
        (TOOL_TASK, "threads.tool send_email", "('send_email', run_1:0:0)"),
        (DELIVER_TASK, None, "deliver:r:completed"),
    ]


def test_control_tasks_send_no_task_events_unless_asked() -> None:
    quiet = _app()
    assert all(quiet.tasks[task].send_events is False for task in CONTROL_TASKS)
    assert quiet.tasks[STEP_TASK].send_events and quiet.tasks[TOOL_TASK].send_events
    shown = create_app(Settings(control_task_events=True), AgentRegistry(), broker_url="redis://127.0.0.1:1/0")
    assert all(shown.tasks[task].send_events is True for task in CONTROL_TASKS)
