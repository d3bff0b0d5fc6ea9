"""Agents whose tasks end otherwise than by running: what Flower's list must tell apart.

Loaded by ``tests/integration/test_flower.py``'s worker beside :mod:`tests.integration.agents_for_tests`
(``THREADS_AGENTS`` names both) and registered with the test's client. ``it_flower_mailer``'s
``send_email`` has no stated effect, so under the default permissions its call waits for approval;
``it_flower_parent`` calls a child agent as a tool, whose call waits for the child's run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from threads_celery import Agent, agent_tool, tool
from threads_celery.testing import ScriptedModel, call, say


class EmailIn(BaseModel):
    to: str = Field(description="Who the email is for")


def _send_email(inp: EmailIn, ctx: Any) -> str:
    return f"sent to {inp.to}"


send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=_send_email)

mailer = Agent(
    name="it_flower_mailer",
    instructions="Email Ann, then say so.",
    model=ScriptedModel([call("send_email", to="ann"), say("emailed ann")]),
    tools=[send_email],
)

child = Agent(name="it_flower_child", instructions="Answer at once.", model=ScriptedModel([say("child done")]))

parent = Agent(
    name="it_flower_parent",
    instructions="Ask the child, then answer.",
    model=ScriptedModel([call("ask_child", message="hello"), say("the child answered")]),
    tools=[agent_tool(child, "Ask the child.", name="ask_child")],
)

ALL_AGENTS = (mailer, child, parent)
