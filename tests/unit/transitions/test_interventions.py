"""Approvals, denials and settling parked calls, end to end on the embedded runtime."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from threads_celery import Agent, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.exceptions import CallNotFound, CallStateError, InvalidArguments
from threads_celery.store.schema import tool_calls
from threads_celery.testing import ScriptedModel, call, say

SENT: list[str] = []
LOCK = threading.Lock()


class EmailIn(BaseModel):
    to: str
    body: str = "hi"


def _send(inp: EmailIn, ctx) -> str:
    with LOCK:
        SENT.append(inp.to)
    return f"sent to {inp.to}"


send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=_send)


def mailer(name: str, permissions: Permissions | None = None) -> Agent:
    return Agent(
        name=name,
        instructions="Send what you are asked to.",
        model=ScriptedModel([call("send_email", to="ann@example.com"), say("Sent.")]),
        tools=[send_email],
        permissions=permissions,
    )


@pytest.fixture
def threads(embedded_threads: Callable[..., Threads]) -> Threads:
    SENT.clear()
    return embedded_threads()


def _awaiting(threads: Threads, agent: Agent) -> tuple[str, str]:
    handle = threads.start(agent, "mail ann")
    run = threads.wait(handle.run_id, 20)
    assert run.status == "awaiting_approval"
    [pending] = threads.parked()
    assert pending.status == "awaiting_approval" and pending.tool == "send_email"
    assert "approval" in pending.reason
    return handle.run_id, pending.effect_key


def test_unguarded_tool_waits_for_approval_and_runs_once_approved(threads: Threads) -> None:
    run_id, key = _awaiting(threads, mailer("m1"))
    assert SENT == []  # nothing ran while waiting
    threads.approve(key, principal="ops@example.com")
    run = threads.wait(run_id, 20)
    assert run.status == "completed" and run.output == "Sent."
    assert SENT == ["ann@example.com"]
    with threads.store.read() as tx:
        row = tx.conn.execute(select(tool_calls).where(tool_calls.c.effect_key == key)).one()
    assert row.approved_by == "ops@example.com" and row.original_args is None


def test_approval_with_edited_arguments_is_validated_and_recorded(threads: Threads) -> None:
    run_id, key = _awaiting(threads, mailer("m2"))
    threads.approve(key, principal="ops", override_args={"to": "bob@example.com"})
    assert threads.wait(run_id, 20).status == "completed"
    assert SENT == ["bob@example.com"]
    with threads.store.read() as tx:
        row = tx.conn.execute(select(tool_calls).where(tool_calls.c.effect_key == key)).one()
    assert row.original_args == '{"to": "ann@example.com"}'
    assert '"bob@example.com"' in row.args


def test_override_arguments_that_fail_the_schema_change_nothing(threads: Threads) -> None:
    run_id, key = _awaiting(threads, mailer("m3"))
    with pytest.raises(InvalidArguments, match="override arguments"):
        threads.approve(key, principal="ops", override_args={"to": "x", "cc": "not a field"})
    assert threads.get_run(run_id).status == "awaiting_approval"
    [pending] = threads.parked()
    assert pending.effect_key == key and pending.status == "awaiting_approval"
    assert SENT == []


def test_denied_call_shows_the_model_the_reason_and_the_run_goes_on(threads: Threads) -> None:
    run_id, key = _awaiting(threads, mailer("m4"))
    threads.deny(key, "no mail on Sundays")
    run = threads.wait(run_id, 20)
    assert run.status == "completed"
    tool_messages = [m for m in threads.messages(run.thread_id) if m.role == "tool"]
    assert tool_messages[-1].text == "denied: no mail on Sundays"
    assert tool_messages[-1].tool_result is not None and tool_messages[-1].tool_result.is_error
    assert SENT == []


def test_allow_list_runs_without_asking(threads: Threads) -> None:
    handle = threads.start(mailer("m5", Permissions(allow=["send_email"])), "mail ann")
    assert threads.wait(handle.run_id, 20).status == "completed"
    assert SENT == ["ann@example.com"]


def test_dont_ask_mode_denies_instead_of_asking(threads: Threads) -> None:
    handle = threads.start(mailer("m6", Permissions("dont_ask")), "mail ann")
    run = threads.wait(handle.run_id, 20)
    assert run.status == "completed"
    assert next(m.text for m in threads.messages(run.thread_id) if m.role == "tool").startswith("denied:")
    assert SENT == []


def test_unknown_or_settled_keys_are_clear_errors_and_change_nothing(threads: Threads) -> None:
    with pytest.raises(CallNotFound):
        threads.approve("no-such-key", principal="ops")
    with pytest.raises(CallNotFound):
        threads.resolve("no-such-key", "assume_done", principal="ops")
    run_id, key = _awaiting(threads, mailer("m7"))
    with pytest.raises(CallStateError, match="not parked"):
        threads.resolve(key, "assume_done", principal="ops")
    threads.approve(key, principal="ops")
    threads.wait(run_id, 20)
    with pytest.raises(CallStateError, match="not awaiting_approval"):
        threads.approve(key, principal="ops")
    with pytest.raises(CallStateError):
        threads.deny(key, "too late")
    assert SENT == ["ann@example.com"]


def _park(threads: Threads, agent: Agent) -> tuple[str, str]:
    """Simulate a worker that died mid-call: claim recorded, lease expired, then redeliver."""
    from datetime import timedelta

    from sqlalchemy import update

    from threads_celery.store.schema import runs as runs_table
    from threads_celery.transitions.runs import utcnow

    run_id, key = _awaiting(threads, agent)
    past = utcnow() - timedelta(seconds=5)
    with threads.store.transaction() as tx:
        tx.conn.execute(
            update(tool_calls)
            .where(tool_calls.c.effect_key == key)
            .values(status="started", attempt=1, first_started_at=past, lease_expires_at=past, approved_args_hash=None)
        )
        tx.conn.execute(update(runs_table).where(runs_table.c.id == run_id).values(status="running"))
    runtime = threads.app.threads_runtime.get()
    outcome = runtime.run_tool(key)
    assert outcome.startswith("parked: unguarded")
    assert threads.get_run(run_id).status == "parked"
    return run_id, key


def test_interrupted_unguarded_call_parks_and_assume_done_records_the_result(threads: Threads) -> None:
    run_id, key = _park(threads, mailer("m8"))
    [pending] = [p for p in threads.parked() if p.effect_key == key]
    assert pending.status == "parked" and "a person must decide" in pending.reason
    threads.resolve(key, "assume_done", principal="ann", result={"message_id": "m-1"})
    run = threads.wait(run_id, 20)
    assert run.status == "completed"
    assert SENT == []  # assume_done never runs the tool
    tool_texts = [m.text for m in threads.messages(run.thread_id) if m.role == "tool"]
    assert tool_texts == ['{"message_id":"m-1"}']


def test_assume_not_done_runs_the_call_again(threads: Threads) -> None:
    run_id, key = _park(threads, mailer("m9"))
    threads.resolve(key, "assume_not_done", principal="ann")
    assert threads.wait(run_id, 20).status == "completed"
    assert SENT == ["ann@example.com"]
    with threads.store.read() as tx:
        row = tx.conn.execute(select(tool_calls).where(tool_calls.c.effect_key == key)).one()
    assert (row.resolution, row.resolved_by, row.attempt) == ("assume_not_done", "ann", 2)
