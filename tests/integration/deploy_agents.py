"""Agents of two deployment versions (tests/integration/test_rolling_deploy.py).

``DEPLOY_CODE`` picks the code: ``v1`` or ``v2``. v2 changes what a deploy changes: the tool
``fax`` is removed, ``send_email``'s argument ``to`` is renamed ``recipient``, the prompts
change, and ``count``'s output schema changes (an integer becomes an object). Every tool
appends its effect key and the code that ran it to ``$DEPLOY_LEDGER``, so a test can tell what
ran where and that nothing ran twice; each final answer names the code that wrote it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, Permissions, tool
from threads_celery.testing import Reply, ScriptedModel, call, calls, say

CODE = os.environ.get("DEPLOY_CODE", "v1")


def _record(ctx: Any, name: str) -> None:
    with Path(os.environ["DEPLOY_LEDGER"]).open("a") as ledger:
        ledger.write(json.dumps({"key": ctx.effect_key, "tool": name, "code": CODE}) + "\n")


class EmailV1(BaseModel):
    model_config = {"extra": "forbid"}
    to: str


class EmailV2(BaseModel):
    model_config = {"extra": "forbid"}
    recipient: str


class Note(BaseModel):
    text: str


class Nothing(BaseModel):
    pass


class Counted(BaseModel):
    n: int


def _send(inp: Any, ctx: Any) -> str:
    _record(ctx, "send_email")
    return "sent"


def _notify(inp: Note, ctx: Any) -> str:
    _record(ctx, "notify")
    return "noted"


def _fax(inp: Note, ctx: Any) -> str:
    _record(ctx, "fax")
    return "faxed"


def _hang(inp: Note, ctx: Any) -> str:
    """Records its pool process, then hangs until that process is killed: the call is parked."""
    with Path(os.environ["DEPLOY_LEDGER"]).open("a") as ledger:
        ledger.write(json.dumps({"key": ctx.effect_key, "tool": "hang", "code": CODE, "pid": os.getpid()}) + "\n")
    while True:
        time.sleep(0.2)


def _count(inp: Nothing, ctx: Any) -> Any:
    _record(ctx, "count")
    return 7 if CODE == "v1" else {"n": 7}


send_email = tool(
    name="send_email", description="Send an email.", input=EmailV1 if CODE == "v1" else EmailV2,
    effect="unguarded", execute=_send,
)  # fmt: skip
notify = tool(name="notify", description="Notify.", input=Note, effect="unguarded", execute=_notify)
hang = tool(name="hang", description="Hang.", input=Note, effect="unguarded", execute=_hang)
fax = tool(name="fax", description="Send a fax.", input=Note, effect="unguarded", execute=_fax)
count = tool(
    name="count", description="Count.", input=Nothing, effect="read_only", execute=_count,
    output=int if CODE == "v1" else Counted,
)  # fmt: skip

ASK = Permissions(ask=["send_email", "notify", "fax"], allow=["count", "hang"])
ARGS = {"to": "ops@example.com"} if CODE == "v1" else {"recipient": "ops@example.com"}
DONE = say(f"done on {CODE}")


def _agent(name: str, tools: list[Any], first: Any, *, versioning: str) -> Agent:
    return Agent(
        name=name,
        instructions=f"{name}, as deployed in {CODE}.",  # the prompt changes with the code
        model=ScriptedModel([first, DONE]),
        tools=tools,
        permissions=ASK,
        versioning=versioning,
    )


mailer = _agent("mailer", [send_email], call("send_email", ARGS), versioning="pinned")
mover = _agent("mover", [notify], call("notify", text="hello"), versioning="upgrade")
renamed = _agent("renamed", [send_email], call("send_email", ARGS), versioning="upgrade")
counter = _agent("counter", [count, notify], calls(("count", {}), ("notify", {"text": "after"})), versioning="upgrade")
# Mid-stream through the deploy: a pinned run whose answer streams slowly, and an upgrading one
# whose first step streams slowly before it asks (its step in flight holds the move back).
streamer = Agent(
    name="streamer",
    instructions=f"Stream ({CODE}).",
    model=ScriptedModel([say(f"done on {CODE}" + " ." * 60)], chunk_size=2, chunk_delay_s=0.03),
)
slow_mover = Agent(
    name="slow_mover",
    instructions=f"slow_mover, as deployed in {CODE}.",
    model=ScriptedModel(
        [Reply(text="thinking" + " ." * 60, calls=(("notify", json.dumps({"text": "slow"})),)), DONE],
        chunk_size=2,
        chunk_delay_s=0.03,
    ),
    tools=[notify],
    permissions=ASK,
    versioning="upgrade",
)
parker = _agent("parker", [hang], call("hang", text="hello"), versioning="upgrade")
keeper = _agent("keeper", [notify], call("notify", text="hello"), versioning="pinned")
greeter = Agent(name="greeter", instructions=f"Greet ({CODE}).", model=ScriptedModel([DONE]))
if CODE == "v1":
    faxer = _agent("faxer", [fax], call("fax", text="hello"), versioning="upgrade")
else:  # fax is gone: the agent keeps no tool
    faxer = _agent("faxer", [notify], call("notify", text="hello"), versioning="upgrade")

ALL_AGENTS = [mailer, mover, renamed, counter, keeper, greeter, faxer, streamer, slow_mover, parker]
