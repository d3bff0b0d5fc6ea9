"""The permission model on the embedded runtime: the accept_edits and plan modes, remembered
decisions ("always allow this tool on this thread"), the ceiling over a child run, and a child's
pending approval shown at its parent and answered there.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.agent_tool_agents import eventually, unique
from threads_celery import Agent, Threads, agent_tool, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.exceptions import RunNotFound
from threads_celery.testing import ScriptedModel, call, say

pytestmark = pytest.mark.embedded(concurrency=3)

WAIT_S = 30.0


class NoteIn(BaseModel):
    text: str


class Ledger:
    """Tools of every effect that record what really ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def _record(self, name: str) -> Any:
        def execute(inp: NoteIn, ctx: Any) -> str:
            self.ran.append(f"{name}:{inp.text}")
            return f"{name} done"

        return execute

    def tools(self) -> list[Any]:
        from threads_celery import NotFound, Reconcile

        return [
            tool(name="read_note", description="Read.", input=NoteIn, effect="read_only", execute=self._record("read_note")),
            tool(
                name="save_note", description="Save (idempotent).", input=NoteIn, effect="idempotent",
                dedup_window_ms=60_000, execute=self._record("save_note"),
            ),
            tool(
                name="file_note", description="File (reconcilable).", input=NoteIn, effect="reconcilable",
                reconcile=Reconcile(finality="final", lookup=lambda key: NotFound()), execute=self._record("file_note"),
            ),
            tool(name="send_note", description="Send (unguarded).", input=NoteIn, execute=self._record("send_note")),
        ]  # fmt: skip


def _agent(ledger: Ledger, script: list[Any], permissions: Permissions | None = None, name: str = "writer") -> Agent:
    return Agent(
        name=unique(name),
        instructions="",
        model=ScriptedModel(script),
        tools=ledger.tools(),
        permissions=permissions,
    )


def _results(threads: Threads, thread_id: str) -> list[tuple[str, bool]]:
    return [
        (m.tool_result.content, m.tool_result.is_error)
        for m in threads.messages(thread_id)
        if m.role == "tool" and m.tool_result is not None
    ]


# -- modes -------------------------------------------------------------------------------------


def test_accept_edits_runs_idempotent_and_reconcilable_tools_and_asks_for_unguarded_ones(
    threads: Threads,
) -> None:
    ledger = Ledger()
    script = [
        call("save_note", text="a"),
        call("file_note", text="b"),
        call("send_note", text="c"),
        say("done"),
    ]
    agent = _agent(ledger, script, Permissions("accept_edits"))
    handle = threads.start(agent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "awaiting_approval"
    assert ledger.ran == ["save_note:a", "file_note:b"]
    [waiting] = threads.pending(handle.run_id)
    assert (waiting.tool, waiting.kind, waiting.status) == (
        "send_note",
        "call",
        "awaiting_approval",
    )
    threads.cancel(handle.run_id)


def test_plan_mode_runs_reads_and_denies_every_change_with_a_reason_the_model_sees(
    threads: Threads,
) -> None:
    ledger = Ledger()
    script = [
        call("read_note", text="a"),
        call("save_note", text="b"),
        call("send_note", text="c"),
        say("plan ready"),
    ]
    agent = _agent(ledger, script, Permissions("plan"))
    handle = threads.start(agent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed" and ledger.ran == ["read_note:a"]
    results = _results(threads, handle.thread_id)
    assert results[0] == ("read_note done", False)
    assert all(error and text.startswith("denied: plan mode") for text, error in results[1:])


# -- remembered decisions --------------------------------------------------------------------


def test_always_allow_is_remembered_on_the_thread_and_can_be_revoked(threads: Threads) -> None:
    ledger = Ledger()
    agent = _agent(ledger, [call("send_note", text="x"), say("sent")])
    first = threads.start(agent, "one")
    assert threads.wait(first.run_id, WAIT_S).status == "awaiting_approval"
    [waiting] = threads.pending(first.run_id)
    threads.approve(waiting.effect_key, principal="ann", remember=True)
    assert threads.wait(first.run_id, WAIT_S).status == "completed"
    [grant] = threads.permission_grants(first.thread_id)
    assert (grant.tool, grant.granted_by) == ("send_note", "ann")

    second = threads.start(agent, "two", thread_id=first.thread_id)
    assert threads.wait(second.run_id, WAIT_S).status == "completed"  # no one was asked
    assert ledger.ran == ["send_note:x", "send_note:x"]

    elsewhere = threads.start(agent, "three")  # another thread: the decision is not remembered there
    assert threads.wait(elsewhere.run_id, WAIT_S).status == "awaiting_approval"
    threads.cancel(elsewhere.run_id)

    assert threads.revoke_permission(first.thread_id, "send_note") is True
    assert threads.revoke_permission(first.thread_id, "send_note") is False
    third = threads.start(agent, "four", thread_id=first.thread_id)
    assert threads.wait(third.run_id, WAIT_S).status == "awaiting_approval"
    threads.cancel(third.run_id)


def test_an_ask_rule_still_asks_on_a_thread_that_remembers_always_allow(threads: Threads) -> None:
    ledger = Ledger()
    agent = _agent(ledger, [call("send_note", text="x"), say("sent")], Permissions(ask=["send_note"]))
    first = threads.start(agent, "one")
    assert threads.wait(first.run_id, WAIT_S).status == "awaiting_approval"
    threads.approve(threads.pending(first.run_id)[0].effect_key, principal="ann", remember=True)
    assert threads.wait(first.run_id, WAIT_S).status == "completed"
    second = threads.start(agent, "two", thread_id=first.thread_id)
    assert threads.wait(second.run_id, WAIT_S).status == "awaiting_approval"
    threads.cancel(second.run_id)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_remember_must_be_a_bool_and_a_bad_value_changes_nothing(threads: Threads, bad: Any) -> None:
    ledger = Ledger()
    handle = threads.start(_agent(ledger, [call("send_note", text="x"), say("sent")]), "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "awaiting_approval"
    key = threads.pending(handle.run_id)[0].effect_key
    with pytest.raises(ValueError, match="remember must be True or False"):
        threads.approve(key, principal="ann", remember=bad)
    assert threads.pending(handle.run_id)[0].status == "awaiting_approval"
    assert threads.permission_grants(handle.thread_id) == [] and ledger.ran == []
    threads.cancel(handle.run_id)


def test_pending_of_an_unknown_run_is_run_not_found(threads: Threads) -> None:
    with pytest.raises(RunNotFound):
        threads.pending("run_does_not_exist")


# -- the ceiling and a child's pending approval ------------------------------------------------


def _family(ledger: Ledger, parent_permissions: Permissions | None, child_script: list[Any]) -> tuple[Agent, Agent]:
    child = _agent(ledger, child_script, Permissions.allow_all(), name="child")
    parent = Agent(
        name=unique("parent"),
        instructions="",
        model=ScriptedModel([call("helper", message="do it"), say("parent done")]),
        tools=[agent_tool(child, "Help.", name="helper")],
        permissions=parent_permissions,
    )
    return parent, child


def test_a_child_is_capped_by_its_parent_and_its_approval_shows_and_is_answered_at_the_parent(
    threads: Threads,
) -> None:
    ledger = Ledger()
    parent, child = _family(ledger, None, [call("send_note", text="from child"), say("child done")])
    handle = threads.start(parent, "go")

    def child_waiting() -> list[Any]:
        return [c for c in threads.pending(handle.run_id) if c.kind == "child"]

    [entry] = eventually(child_waiting, what="the child's call shown at the parent")
    assert (entry.tool, entry.status, entry.agent) == ("send_note", "awaiting_approval", child.name)
    assert "a parent's permissions cap this child's" in entry.reason
    assert entry.via is not None and entry.via.startswith("agent-tool:")
    assert threads.get_run(handle.run_id).status == "waiting" and ledger.ran == []
    events = [(e.type, e.payload) for e in threads.events(handle.thread_id) if e.type.startswith("pending.")]
    assert [(t, p["effect_key"], p["kind"]) for t, p in events] == [("pending.child", entry.effect_key, "child")]

    threads.approve(entry.effect_key, principal="ann")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed" and ledger.ran == ["send_note:from child"]
    answered = [e.payload for e in threads.events(handle.thread_id) if e.type == "pending.answered"]
    assert [(p["effect_key"], p["answer"]) for p in answered] == [(entry.effect_key, "approved")]
    assert threads.pending(handle.run_id) == []


def test_a_childs_call_denied_from_the_parent_reaches_the_child_model(threads: Threads) -> None:
    ledger = Ledger()
    parent, _child = _family(ledger, None, [call("send_note", text="x"), say("child gave up")])
    handle = threads.start(parent, "go")
    [entry] = eventually(lambda: threads.pending(handle.run_id), what="the child's call at the parent")
    threads.deny(entry.effect_key, "not from a child", principal="ann")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    child_thread = threads.agent_tool_runs(handle.thread_id)[0].child_thread_id
    assert _results(threads, child_thread) == [("denied: not from a child", True)]
    assert ledger.ran == []


def test_a_parent_in_plan_mode_denies_its_childs_changes(threads: Threads) -> None:
    ledger = Ledger()
    parent, _child = _family(ledger, Permissions("plan"), [call("save_note", text="x"), say("child done")])
    handle = threads.start(parent, "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    child_thread = threads.agent_tool_runs(handle.thread_id)[0].child_thread_id
    [(text, error)] = _results(threads, child_thread)
    assert error and text.startswith("denied: plan mode") and ledger.ran == []


def test_a_parent_allow_rule_does_not_lift_the_childs_own_ask(threads: Threads) -> None:
    ledger = Ledger()
    child = _agent(
        ledger,
        [call("send_note", text="x"), say("child done")],
        Permissions(ask=["send_note"]),
        name="child",
    )
    parent = Agent(
        name=unique("parent"),
        instructions="",
        model=ScriptedModel([call("helper", message="do it"), say("parent done")]),
        tools=[agent_tool(child, "Help.", name="helper")],
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(parent, "go")
    [entry] = eventually(lambda: threads.pending(handle.run_id), what="the child's own ask at the parent")
    assert entry.kind == "child" and entry.reason == "tool 'send_note' asks for approval by rule"
    threads.cancel(handle.run_id)


def test_always_allow_given_for_a_childs_call_holds_on_the_childs_thread(threads: Threads) -> None:
    ledger = Ledger()
    script = [call("send_note", text="1"), call("send_note", text="2"), say("child done")]
    parent, _child = _family(ledger, None, script)
    handle = threads.start(parent, "go")
    [entry] = eventually(lambda: threads.pending(handle.run_id), what="the child's first call at the parent")
    threads.approve(entry.effect_key, principal="ann", remember=True)
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"  # the second call did not ask
    assert ledger.ran == ["send_note:1", "send_note:2"]
    child_thread = threads.agent_tool_runs(handle.thread_id)[0].child_thread_id
    assert [g.tool for g in threads.permission_grants(child_thread)] == ["send_note"]
    assert threads.permission_grants(handle.thread_id) == []


def test_a_grandchilds_pending_call_shows_at_the_root(threads: Threads) -> None:
    ledger = Ledger()
    grandchild = _agent(ledger, [call("send_note", text="deep"), say("gc done")], Permissions.allow_all(), name="gc")
    middle = Agent(
        name=unique("middle"),
        instructions="",
        model=ScriptedModel([call("deeper", message="go"), say("middle done")]),
        tools=[agent_tool(grandchild, "Deeper.", name="deeper")],
        permissions=Permissions.allow_all(),
    )
    root = Agent(
        name=unique("root"),
        instructions="",
        model=ScriptedModel([call("middle", message="go"), say("root done")]),
        tools=[agent_tool(middle, "Middle.", name="middle")],
    )
    handle = threads.start(root, "go")
    [entry] = eventually(lambda: threads.pending(handle.run_id), what="the grandchild's call at the root")
    assert (entry.kind, entry.agent, entry.tool) == ("child", grandchild.name, "send_note")
    assert entry.via is not None and json.dumps(entry.via)
    threads.approve(entry.effect_key, principal="ann")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert ledger.ran == ["send_note:deep"]
