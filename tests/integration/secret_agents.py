"""An agent whose tool handles a hostile secret carelessly, for the canary tests' worker.

``careless`` reads the ``PRIVATE_KEY`` secret, logs it, prints it and returns it inside a dict;
``echo_key`` raises it as a ``KeyError``. The last call goes to a queue no worker consumes, so
its task message stays in Redis for the test to read.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, Variable, tool
from threads_celery.testing import ScriptedModel, call, say

IDLE_QUEUE = "tc-canary-idle"
log = logging.getLogger("careless.tool")


class Empty(BaseModel):
    pass


def _careless(inp: Empty, ctx: Any) -> dict[str, Any]:
    key = ctx.env("PRIVATE_KEY")
    log.warning("connecting with key %s (%r)", key, key)
    print(f"debug: key={key}")
    print(json.dumps({"key": key}), file=sys.stderr)
    return {"key": key, "lines": key.splitlines()}


def _echo_key(inp: Empty, ctx: Any) -> str:
    key = ctx.env("PRIVATE_KEY")
    try:
        raise KeyError(key)
    except KeyError:
        log.exception("lookup failed for %s", key)
        raise


variables = [Variable("PRIVATE_KEY", "secret", required=True)]
careless = tool(
    name="careless", description="x", input=Empty, effect="read_only", execute=_careless, variables=variables
)
echo_key = tool(
    name="echo_key", description="x", input=Empty, effect="read_only", execute=_echo_key, variables=variables
)
parked_forever = tool(
    name="never_runs", description="x", input=Empty, effect="read_only", execute=lambda i, c: "ran", queue=IDLE_QUEUE
)

leaker = Agent(
    name="it_leaker",
    instructions="x",
    model=ScriptedModel([call("careless"), call("echo_key"), call("never_runs"), say("done")]),
    tools=[careless, echo_key, parked_forever],
)

ALL_AGENTS = [leaker]
