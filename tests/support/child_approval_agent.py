"""A parent whose agent-tool child calls an unguarded tool: the parent's default permissions cap
the child (which would allow everything), so the child's call waits for approval and shows at
the parent as a pending entry of kind child. Used by the CLI and web acceptance tests
(``threads-celery run tests/support/child_approval_agent.py:agent "go" --approve``).

The tool appends a line to ``child-effects.txt`` in the working directory: what really ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, agent_tool, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say


class NoteIn(BaseModel):
    text: str


def _send(inp: NoteIn, ctx: Any) -> str:
    with Path("child-effects.txt").open("a") as f:
        f.write(inp.text + "\n")
    return f"sent {inp.text}"


send_note = tool(name="send_note", description="Send a note (unguarded).", input=NoteIn, execute=_send)

child = Agent(
    name="child_approval_child",
    instructions="Send the note.",
    model=ScriptedModel([call("send_note", text="hello from the child"), say("child sent it")]),
    tools=[send_note],
    permissions=Permissions.allow_all(),
)

agent = Agent(
    name="child_approval_parent",
    instructions="Delegate.",
    model=ScriptedModel([call("helper", message="send the note"), say("parent done")]),
    tools=[agent_tool(child, "Send notes.", name="helper")],
)
