"""An awaited child past the parent's finite maximum window: window-exceeded, torn down."""

from __future__ import annotations

import threading
from datetime import timedelta

from pydantic import BaseModel
from sqlalchemy import update

from tests.support.waiting import eventually
from threads_celery import Agent, Permissions, Threads, agent_tool, tool
from threads_celery.store.schema import agent_tool_runs
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow

GATE = threading.Event()


class In(BaseModel):
    q: str


slow = tool(name="slow", description="x", input=In, effect="read_only", execute=lambda i, c: GATE.wait(10) and "late")
child = Agent(
    name="slowpoke", instructions="x", model=ScriptedModel([call("slow", q="x"), say("finished")]), tools=[slow]
)


class Parent(Agent):
    name = "windowed"
    instructions = "x"
    model = ScriptedModel([call("slowpoke", message="go"), say("gave up")])
    tools = [agent_tool(child, "Slow child.")]  # noqa: RUF012 - an Agent subclass declares its tools as a class attribute
    permissions = Permissions.allow_all()
    agent_tool_max_window_ms = 60_000


def test_an_awaited_child_past_the_maximum_window_is_sealed_window_exceeded_and_torn_down() -> None:
    GATE.clear()
    with Threads.embedded() as threads:
        handle = threads.start(Parent(), "go")
        eventually(lambda: threads.agent_tool_runs(handle.thread_id), timeout=10, what="the child run in the registry")
        [row] = threads.agent_tool_runs(handle.thread_id)
        with threads.store.transaction() as tx:  # the window has passed
            tx.conn.execute(
                update(agent_tool_runs).values(
                    check_at=utcnow() - timedelta(seconds=1), started_at=utcnow() - timedelta(minutes=5)
                )
            )
        threads.reconcile()
        run = threads.wait(handle.run_id, 20)
        GATE.set()
        assert run.status == "completed" and run.output == "gave up"
        sealed = threads.inspect_agent_tool_run(row.run_id)
        assert (sealed.status, sealed.reason, sealed.child_still_running) == ("interrupted", "window-exceeded", False)
        assert threads.get_run(sealed.child_run_id).status == "aborted"
        failure = next(m.text for m in threads.messages(handle.thread_id) if m.role == "tool")
        assert '"reason":"window-exceeded"' in failure and '"retryable":true' in failure
