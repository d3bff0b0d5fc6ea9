"""A tool that raises EffectUnknown (its remote end failed mid-call): decided by the call's effect.

A read_only call ends as a tool error the model sees; any other call parks for a person, exactly
as after a crash mid-call. Embedded runtime (SQLite and the in-process worker).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pydantic import BaseModel

from threads_celery import Agent, EffectUnknown, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 30.0
_names = itertools.count()


class NoInput(BaseModel):
    pass


def _agent_with_failing_tool(effect: str, calls: list[str]) -> Agent:
    def execute(inp: Any, ctx: Any) -> str:
        calls.append(ctx.effect_key)
        raise EffectUnknown("the remote service dropped the connection mid-call")

    options: dict[str, Any] = {"dedup_window_ms": 60_000} if effect == "idempotent" else {}
    remote = tool(
        name="remote",
        description="Call the remote service.",
        input=NoInput,
        execute=execute,
        effect=effect,
        **options,
    )
    return Agent(
        f"effect_unknown_{next(_names)}",
        "Call it.",
        ScriptedModel([call("remote"), say("done")]),
        tools=[remote],
        permissions=Permissions.allow_all(),
    )


def test_read_only_effect_unknown_is_a_tool_error(threads: Threads) -> None:
    calls: list[str] = []
    handle = threads.start(_agent_with_failing_tool("read_only", calls), "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [result] = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert result.is_error
    assert result.content == "the remote service dropped the connection mid-call"
    assert len(calls) == 1


@pytest.mark.parametrize("effect", ["idempotent", "unguarded"])
def test_effect_unknown_parks_a_call_that_is_not_read_only(threads: Threads, effect: str) -> None:
    calls: list[str] = []
    handle = threads.start(_agent_with_failing_tool(effect, calls), "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "parked"
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert pending.status == "parked"
    assert pending.reason == "the remote service dropped the connection mid-call"
    assert calls == [pending.effect_key]  # ran once, not retried behind anyone's back
    threads.resolve(pending.effect_key, "assume_done", principal="tester")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"


SECRET = "sk-live-0123456789abcdef"


def test_a_park_reason_is_redacted_of_the_thread_secrets_the_tool_never_read_through_env(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tool has the key by other means (a client built from it, say) and its exception quotes
    # it: the reason is still redacted before it is stored, logged or returned.
    from cryptography.fernet import Fernet

    from threads_celery import Variable

    monkeypatch.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())

    def execute(inp: Any, ctx: Any) -> str:
        raise EffectUnknown(f"the provider rejected key={SECRET} mid-call")

    remote = tool(
        name="remote",
        description="x",
        input=NoInput,
        execute=execute,
        effect="unguarded",
        variables=[Variable("API_KEY", "secret")],
    )
    agent = Agent(
        f"effect_unknown_{next(_names)}",
        "Call it.",
        ScriptedModel([call("remote"), say("done")]),
        tools=[remote],
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "go", env={"API_KEY": SECRET})
    assert threads.wait(handle.run_id, WAIT_S).status == "parked"
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert pending.reason == "the provider rejected key=*** mid-call"
    assert all(SECRET not in (e.reason or "") for e in threads.parked())
