"""Agents whose tools handle a hostile secret carelessly, for the canary tests' worker.

``careless`` reads the ``PRIVATE_KEY`` secret, logs it, prints it and returns it inside a dict;
``echo_key`` raises it as a ``KeyError``. The last call goes to a queue no worker consumes, so
its task message stays in Redis for the test to read.

``below_python`` writes it past Python's streams: ``os.write`` on fds 1 and 2 (once in two
pieces), a subprocess that prints it, and a thread that logs and writes it after the call has
ended; ``invalid_input`` raises the ``ValidationError`` of a model given the secret.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
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


def _below_python(inp: Empty, ctx: Any) -> str:
    key = ctx.env("PRIVATE_KEY")
    raw = key.encode()
    os.write(1, b"fd1: key=" + raw + b"\n")
    os.write(2, b"fd2: key=" + raw + b"\n")
    os.write(1, b"split: key=" + raw[:27])  # the rest comes in a second write
    time.sleep(0.01)
    os.write(1, raw[27:] + b" :end\n")
    subprocess.run(["sh", "-c", 'printf "child: key=%s\\n" "$KEY"'], env={"KEY": key}, check=True)

    def later() -> None:  # outlives the call: its secret is no longer active when this runs
        time.sleep(0.5)
        log.warning("late: key=%s", key)
        os.write(2, b"late fd2: key=" + raw + b"\n")

    threading.Thread(target=later, daemon=True).start()
    return "wrote it below Python"


class Port(BaseModel):
    port: int


def _invalid_input(inp: Empty, ctx: Any) -> str:
    key = ctx.env("PRIVATE_KEY")
    Port.model_validate({"port": key.replace("\n", " ")})  # one line: pydantic shortens it in its repr
    return "unreachable"


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

below_python = tool(
    name="below_python", description="x", input=Empty, effect="read_only", execute=_below_python, variables=variables
)
invalid_input = tool(
    name="invalid_input", description="x", input=Empty, effect="read_only", execute=_invalid_input, variables=variables
)
raw_writer = Agent(
    name="it_raw_writer",
    instructions="x",
    model=ScriptedModel([call("below_python"), call("invalid_input"), say("done")]),
    tools=[below_python, invalid_input],
)

# Holds no secret: what a monitor's warm-up runs (tests.integration.test_flower.listening).
quiet = Agent(name="it_quiet", instructions="Answer at once.", model=ScriptedModel([say("quiet")]))

ALL_AGENTS = [leaker, raw_writer, quiet]
