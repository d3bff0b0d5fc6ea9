"""Agents for the history tests (export, erasure, retention), loaded by their worker and client.

``hist_tools`` reads a secret and a text variable in a read_only tool, so a thread of it holds
a tool call, usage rows and a sealed secret; ``hist_parent`` asks ``hist_child`` through an
agent tool, so its thread has a child thread; ``hist_asks`` calls an unguarded tool under the
default permissions, so its run waits for an approval (a run that has not finished).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, Variable, agent_tool, tool
from threads_celery.testing import ScriptedModel, call, say

SECRET_VALUE = "sk-history-canary-5f1e9c"
FERNET_KEY = "pb7pWkWQvXk2GthG2XRMIPmk_YHhTM6Hit2yzC-yvaY="


class Empty(BaseModel):
    pass


def _lookup(inp: Empty, ctx: Any) -> str:
    token = ctx.env("API_TOKEN")
    return f"looked up {ctx.env('CITY')} with a token of {len(token)} characters"


def _send(inp: Empty, ctx: Any) -> str:
    return "sent"


lookup = tool(
    name="lookup", description="Look a city up.", input=Empty, effect="read_only", execute=_lookup,
    variables=[Variable("API_TOKEN", type="secret"), Variable("CITY")],
)  # fmt: skip
send = tool(name="send", description="Send it.", input=Empty, effect="unguarded", execute=_send)

hist_tools = Agent(
    name="hist_tools",
    instructions="Look up, then answer.",
    model=ScriptedModel([call("lookup"), say("looked it up")]),
    tools=[lookup],
)
hist_child = Agent(name="hist_child", instructions="Answer at once.", model=ScriptedModel([say("child done")]))
hist_parent = Agent(
    name="hist_parent",
    instructions="Ask the child, then answer.",
    model=ScriptedModel([call("ask_child", message="hello"), say("the child answered")]),
    tools=[agent_tool(hist_child, "Ask the child.", name="ask_child")],
)
hist_asks = Agent(
    name="hist_asks",
    instructions="Send, then answer.",
    model=ScriptedModel([call("send"), say("sent it")]),
    tools=[send],
)

ALL_AGENTS = (hist_tools, hist_child, hist_parent, hist_asks)
