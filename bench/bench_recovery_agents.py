"""The agent bench/recovery.py runs: one idempotent call that sleeps long enough to be killed."""

import time

from pydantic import BaseModel

from threads_celery import Agent, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say


class SleepIn(BaseModel):
    seconds: float


def _sleep(inp: SleepIn, ctx) -> str:
    if ctx.attempt == 1:
        time.sleep(inp.seconds)
    return f"slept (attempt {ctx.attempt})"


slow_charge = tool(
    name="slow_charge",
    description="An idempotent call that takes a while on its first attempt.",
    input=SleepIn,
    effect="idempotent",
    dedup_window_ms=24 * 3600 * 1000,
    execute=_sleep,
)

agent = Agent(
    name="bench-recovery",
    instructions="Charge.",
    model=ScriptedModel([call("slow_charge", seconds=600), say("charged")]),
    tools=[slow_charge],
    permissions=Permissions.allow_all(),
)
