"""What the parallel-calls benchmark worker imports (``THREADS_AGENTS=bench.bench_parallel_agents``).

``bench_parallel``: an agent whose scripted model answers the user message
``"<tool> <count> <ms>"`` with one reply calling ``<tool>`` ``count`` times with ``{"ms": ms}``,
then ``done``. ``sleep_concurrent`` is read_only and concurrent; ``sleep_in_order`` is read_only
and runs in order. Both sleep ``ms`` milliseconds (the stand-in for a slow read).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import Reply, ScriptedModel, say


class SleepIn(BaseModel):
    ms: int


def _sleep(inp: SleepIn, ctx: Any) -> str:
    time.sleep(inp.ms / 1000)
    return "ok"


sleep_concurrent = tool(
    name="sleep_concurrent", description="Sleep (read_only, concurrent).", input=SleepIn,
    effect="read_only", concurrent=True, execute=_sleep,
)  # fmt: skip
sleep_in_order = tool(
    name="sleep_in_order", description="Sleep (read_only, in order).", input=SleepIn,
    effect="read_only", execute=_sleep,
)  # fmt: skip


def _first_turn(messages: list[Any]) -> Reply:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    name, count, ms = str(part.content).split()
                    return Reply(calls=tuple((name, json.dumps({"ms": int(ms)})) for _ in range(int(count))))
    raise ValueError("no user message")


bench_parallel = Agent(
    name="bench_parallel",
    instructions="Sleep as told.",
    model=ScriptedModel([_first_turn, say("done")], model_name="bench-parallel"),
    tools=[sleep_concurrent, sleep_in_order],
    permissions=Permissions.allow_all(),
)
