"""Branches of a thread's history through the client: regenerate, edit, rewind and fork.

Each test runs on SQLite and on PostgreSQL (where a model step reads its history with its claim,
through the worker's history cache), with a real in-process Celery worker. The model records the
conversation it is given, so each test checks what the provider would have received, and the
tools count their executions, so each checks what ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, SystemPromptPart, TextPart, UserPromptPart

from threads_celery import Agent, Permissions, Threads, tool
from threads_celery.exceptions import BranchPointNotFound, ThreadBusy
from threads_celery.records import Run
from threads_celery.settings import Settings
from threads_celery.testing import Reply, ScriptedModel, call, say

WAIT_S = 30.0
executed: list[str] = []
seen: list[list[tuple[str, str]]] = []


class ChargeIn(BaseModel):
    amount: int


def _charge(inp: ChargeIn, ctx: Any) -> str:
    executed.append(ctx.effect_key)
    return f"charged {inp.amount}"


charge = tool(name="charge", description="Charge.", input=ChargeIn, execute=_charge, effect="unguarded")
reserve = tool(
    name="reserve", description="Reserve.", input=ChargeIn, execute=_charge, effect="idempotent", dedup_window_ms=60_000
)


def _flat(messages: list[ModelMessage]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for message in messages:
        for part in message.parts:
            if isinstance(message, ModelRequest) and isinstance(part, UserPromptPart):
                out.append(("user", str(part.content)))
            elif isinstance(message, ModelResponse) and isinstance(part, TextPart):
                out.append(("assistant", part.content))
            elif isinstance(message, ModelRequest) and isinstance(part, SystemPromptPart):
                continue
            else:
                out.append((type(part).__name__, getattr(part, "tool_name", "") or ""))
    return out


def recorded(reply: Reply | str) -> Any:
    def entry(messages: list[ModelMessage]) -> Reply | str:
        seen.append(_flat(messages))
        return reply

    return entry


def _numbered(messages: list[ModelMessage]) -> str:
    seen.append(_flat(messages))
    return f"answer {len(seen)}"


chatty = Agent(name="branch_chatty", instructions="Answer.", model=ScriptedModel([_numbered]))
payer = Agent(
    name="branch_payer",
    instructions="Pay.",
    model=ScriptedModel([recorded(call("charge", amount=5)), recorded(say("Paid."))]),
    tools=[charge],
    permissions=Permissions.allow_all(),
)
booker = Agent(
    name="branch_booker",
    instructions="Book.",
    model=ScriptedModel([recorded(call("reserve", amount=2)), recorded(say("Booked."))]),
    tools=[reserve],
    permissions=Permissions.allow_all(),
)
asker = Agent(
    name="branch_asker",
    instructions="Pay after asking.",
    model=ScriptedModel([recorded(call("charge", amount=7)), recorded(say("Paid."))]),
    tools=[charge],
)


@pytest.fixture(params=["sqlite", "postgresql"])
def threads(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Threads]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    runtime = Threads(database_url=url, broker_url="memory://", settings=Settings(), migrate=True)
    for agent in (chatty, payer, booker, asker):
        runtime.register(agent)
    runtime.start_worker(reconcile_interval=None)
    executed.clear()
    seen.clear()
    try:
        yield runtime
    finally:
        runtime.stop_worker()
        runtime.close()


def finish(threads: Threads, run_id: str, status: str = "completed") -> Run:
    run = threads.wait(run_id, WAIT_S)
    assert run.status == status, (run.status, run.error)
    return run


def texts(threads: Threads, thread_id: str, **kw: Any) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in threads.messages(thread_id, **kw) if m.text]


def test_regenerating_the_last_reply_answers_the_same_message_again_and_keeps_the_old_reply(threads: Threads) -> None:
    first = finish(threads, threads.start(chatty, "hello").run_id)
    second = finish(threads, threads.start(chatty, "and again", thread_id=first.thread_id).run_id)
    assert texts(threads, first.thread_id) == [
        ("user", "hello"), ("assistant", "answer 1"), ("user", "and again"), ("assistant", "answer 2")
    ]  # fmt: skip
    again = threads.regenerate(first.thread_id)
    finish(threads, again.run_id)
    assert again.run_id != second.id
    assert texts(threads, first.thread_id) == [
        ("user", "hello"), ("assistant", "answer 1"), ("user", "and again"), ("assistant", "answer 3")
    ]  # fmt: skip
    # The model was given the history up to the user's message: not the reply it replaces.
    assert seen[-1] == [("user", "hello"), ("assistant", "answer 1"), ("user", "and again")]
    everything = threads.messages(first.thread_id, include_superseded=True)
    left = [(m.role, m.text) for m in everything if m.superseded_by is not None]
    assert left == [("user", "and again"), ("assistant", "answer 2")]
    [branch] = threads.branches(first.thread_id)
    assert branch.kind == "regenerate" and {m.superseded_by for m in everything} == {None, branch.id}


def test_editing_an_earlier_message_drops_what_followed_from_the_models_input(threads: Threads) -> None:
    first = finish(threads, threads.start(chatty, "hello").run_id)
    finish(threads, threads.start(chatty, "second", thread_id=first.thread_id).run_id)
    edited = threads.edit(first.thread_id, first.id, "hello, edited")
    finish(threads, edited.run_id)
    assert seen[-1] == [("user", "hello, edited")]
    assert texts(threads, first.thread_id) == [("user", "hello, edited"), ("assistant", "answer 3")]
    # The thread goes on from the new branch.
    finish(threads, threads.start(chatty, "next", thread_id=first.thread_id).run_id)
    assert seen[-1] == [("user", "hello, edited"), ("assistant", "answer 3"), ("user", "next")]


def test_rewinding_past_an_unguarded_call_that_ran_asks_before_it_runs_again(threads: Threads) -> None:
    run = finish(threads, threads.start(payer, "pay").run_id)
    assert len(executed) == 1
    user = threads.messages(run.thread_id)[0]
    branch = threads.rewind(run.thread_id, user.seq)
    assert branch is not None and [p.effect_key for p in branch.prior_effects] == executed
    again = threads.start(payer, "pay once more", thread_id=run.thread_id)
    waiting = finish(threads, again.run_id, "awaiting_approval")
    [pending] = threads.pending(waiting.id)
    assert executed[0] in pending.reason and "already ran" in pending.reason
    assert len(executed) == 1  # nothing ran again without a person
    threads.approve(pending.effect_key, principal="ann")
    finish(threads, again.run_id)
    assert len(executed) == 2 and executed[1] != executed[0]


def test_a_fork_copies_results_and_never_runs_them_again(threads: Threads) -> None:
    run = finish(threads, threads.start(booker, "book").run_id)
    assert len(executed) == 1
    history = threads.messages(run.thread_id)
    result = next(m for m in history if m.role == "tool")
    fork = threads.fork(run.thread_id, result.seq)
    copied = threads.messages(fork.thread_id)
    assert [(m.role, m.text) for m in copied] == [(m.role, m.text) for m in history if m.seq <= result.seq]
    assert len(executed) == 1
    # The source is untouched.
    assert threads.messages(run.thread_id) == history
    # An idempotent tool called again on the fork is a new effect, with its own key.
    finish(threads, threads.start(booker, "book again", thread_id=fork.thread_id).run_id)
    assert len(executed) == 2 and executed[1] != executed[0]
    assert fork.prior_effects == ()  # idempotent: a repeat cannot double it


def test_a_call_awaiting_approval_at_the_fork_point_is_not_copied_as_pending(threads: Threads) -> None:
    waiting = finish(threads, threads.start(asker, "pay").run_id, "awaiting_approval")
    [pending] = threads.pending(waiting.id)
    history = threads.messages(waiting.thread_id)
    fork = threads.fork(waiting.thread_id, history[-1].seq)
    assert fork.dropped_calls == (pending.effect_key,)
    copied = threads.messages(fork.thread_id)
    assert [m.role for m in copied] == ["user"] and not any(m.tool_calls for m in copied)
    assert threads.pending(waiting.id) == [pending]  # the source still waits for its person
    assert executed == []


def test_grants_are_inherited_by_a_fork_only_when_asked(threads: Threads) -> None:
    waiting = finish(threads, threads.start(asker, "pay").run_id, "awaiting_approval")
    [pending] = threads.pending(waiting.id)
    threads.approve(pending.effect_key, principal="ann", remember=True)
    run = finish(threads, waiting.id)
    assert [g.tool for g in threads.permission_grants(run.thread_id)] == ["charge"]
    plain = threads.fork(run.thread_id, 0)
    granted = threads.fork(run.thread_id, 0, inherit_grants=True)
    assert threads.permission_grants(plain.thread_id) == []
    assert [g.tool for g in threads.permission_grants(granted.thread_id)] == ["charge"]


def test_a_thread_with_a_run_in_progress_cannot_branch_in_place(threads: Threads) -> None:
    waiting = finish(threads, threads.start(asker, "pay").run_id, "awaiting_approval")
    with pytest.raises(ThreadBusy):
        threads.rewind(waiting.thread_id, 0)
    with pytest.raises(ThreadBusy):
        threads.regenerate(waiting.thread_id)
    assert threads.branches(waiting.thread_id) == []


def test_a_branch_point_off_the_current_branch_is_refused(threads: Threads) -> None:
    run = finish(threads, threads.start(chatty, "hello").run_id)
    with pytest.raises(BranchPointNotFound):
        threads.rewind(run.thread_id, 99)
    reply = threads.messages(run.thread_id)[-1]
    assert threads.rewind(run.thread_id, reply.seq) is None  # nothing follows: nothing to branch
    threads.rewind(run.thread_id, 0)
    with pytest.raises(BranchPointNotFound):
        threads.rewind(run.thread_id, reply.seq)  # superseded now
