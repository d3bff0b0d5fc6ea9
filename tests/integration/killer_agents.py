"""Agents whose tools or steps kill the pool process running them (tests/integration/test_lost_workers.py).

Each counts its runs in ``$KILLER_DIR/<name>.runs`` before it dies, so a test can tell how often it
was run. ``survivor`` is an ordinary agent: the next run after the killings.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, Permissions, tool
from threads_celery.testing import ScriptedModel, call, say


class NoInput(BaseModel):
    pass


def _count(name: str) -> None:
    with (Path(os.environ["KILLER_DIR"]) / f"{name}.runs").open("a") as runs:
        runs.write(f"{os.getpid()}\n")


def _die(name: str) -> Any:
    def execute(inp: NoInput, ctx: Any) -> str:
        _count(name)
        os._exit(1)  # the pool process is gone, as if killed or out of memory

    return execute


def _killer(effect: str) -> Agent:
    name = f"die_{effect}"
    window = {"dedup_window_ms": 600_000} if effect == "idempotent" else {}
    dies = tool(name=name, description="Dies.", input=NoInput, effect=effect, execute=_die(name), **window)  # type: ignore[arg-type]
    return Agent(
        name=f"killer_{effect}",
        instructions="Call the tool, then answer.",
        model=ScriptedModel([call(name), say("never reached")]),
        tools=[dies],
        permissions=Permissions.allow_all(),
    )


def _stubborn(inp: NoInput, ctx: Any) -> str:
    """Ignores the soft time limit's exception and sleeps on: only the hard limit ends it."""
    _count("stubborn")
    while True:
        with contextlib.suppress(BaseException):  # written to outlast the soft limit
            time.sleep(60)


killer_read_only = _killer("read_only")
past_the_limit = Agent(
    name="past_the_limit",
    instructions="Call the tool, then answer.",
    model=ScriptedModel([call("stubborn"), say("never reached")]),
    tools=[tool(name="stubborn", description="Sleeps.", input=NoInput, effect="read_only", execute=_stubborn)],
    permissions=Permissions.allow_all(),
)
killer_idempotent = _killer("idempotent")


class DyingStep(Agent):
    """Its context hook kills the pool process running the step."""

    def before_step(self, ctx: Any) -> str:
        _count("dying_step")
        os._exit(1)


dying_step = DyingStep(name="dying_step", instructions="Answer.", model=ScriptedModel([say("never")]))

survivor = Agent(name="survivor", instructions="Answer.", model=ScriptedModel([say("still here")]))

ALL_AGENTS = [killer_read_only, killer_idempotent, past_the_limit, dying_step, survivor]
