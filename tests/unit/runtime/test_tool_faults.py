"""Whatever a tool raises is a tool error or a park, by its effect, never a stuck or lost run.

BaseException subclasses, ones whose constructor needs an argument, ones whose ``__str__``,
``__repr__`` or ``__reduce__`` raise, ``SystemExit`` and ``KeyboardInterrupt`` from the tool's own
code: each is handled like an ordinary exception. An ``EffectUnknown`` that names a secret parks
with the secret redacted. Embedded runtime (SQLite and the in-process worker).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel

from threads_celery import Agent, EffectUnknown, Threads, Variable, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 30.0
SECRET = "sk-live-parkreason-7f3a9c1e5b"
_names = itertools.count()


class NoInput(BaseModel):
    pass


class NeedsArgument(BaseException):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"failed with {code}")
        self.code, self.detail = code, detail


class HostileRendering(BaseException):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __reduce__(self) -> Any:
        raise RuntimeError("no reduce")


class PlainBase(BaseException):
    pass


RAISERS: dict[str, Callable[[], BaseException]] = {
    "ctor_argument": lambda: NeedsArgument(7, "x"),
    "hostile_rendering": HostileRendering,
    "system_exit": lambda: SystemExit(3),
    "keyboard_interrupt": KeyboardInterrupt,
    "plain_base_exception": lambda: PlainBase("plain"),
}


def _agent(effect: str, raise_it: Callable[[], BaseException], calls: list[str]) -> Agent:
    def execute(inp: Any, ctx: Any) -> str:
        calls.append(ctx.effect_key)
        raise raise_it()

    options: dict[str, Any] = {"dedup_window_ms": 60_000} if effect == "idempotent" else {}
    bad = tool(name="bad", description="Fail.", input=NoInput, execute=execute, effect=effect, **options)
    return Agent(
        f"tool_faults_{next(_names)}",
        "Call it.",
        ScriptedModel([call("bad"), say("done")]),
        tools=[bad],
        permissions=Permissions.allow_all(),
    )


@pytest.mark.parametrize("effect", ["read_only", "unguarded", "idempotent"])
@pytest.mark.parametrize("kind", sorted(RAISERS))
def test_whatever_a_tool_raises_is_a_tool_error_the_model_sees(threads: Threads, kind: str, effect: str) -> None:
    calls: list[str] = []
    handle = threads.start(_agent(effect, RAISERS[kind], calls), "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [result] = [m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result is not None]
    assert result.is_error
    assert type(RAISERS[kind]()).__name__ in result.content
    assert len(calls) == 1
    # The runtime goes on: a next run completes.
    calls.clear()
    nxt = threads.start(_agent(effect, RAISERS[kind], calls), "again")
    assert threads.wait(nxt.run_id, WAIT_S).status == "completed"


def test_an_effect_unknown_naming_a_secret_parks_with_the_secret_redacted(
    threads: Threads, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())
    caplog.set_level(logging.DEBUG)
    calls: list[str] = []

    def execute(inp: Any, ctx: Any) -> str:
        calls.append(ctx.effect_key)
        raise EffectUnknown(f"gateway dropped mid-call; key={ctx.env('API_KEY')}")

    remote = tool(
        name="remote",
        description="Call it.",
        input=NoInput,
        execute=execute,
        effect="idempotent",
        dedup_window_ms=60_000,
        variables=[Variable("API_KEY", "secret", required=True)],
    )
    agent = Agent(
        f"tool_faults_{next(_names)}",
        "Call it.",
        ScriptedModel([call("remote"), say("done")]),
        tools=[remote],
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "go", env={"API_KEY": SECRET})
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "parked"
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert SECRET not in pending.reason
    assert "gateway dropped mid-call" in pending.reason
    assert SECRET not in (run.error or "")
    assert len(calls) == 1
    assert "gateway dropped mid-call" in caplog.text  # the park was logged, redacted
    assert SECRET not in caplog.text
