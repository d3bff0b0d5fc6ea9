"""Scripted agents for the console's tests: each puts a person in the loop in one way, and every
text a person sees (model text, tool arguments, tool results) carries an HTML/script payload that
must show as text.

- ``console_parent`` delegates to ``console_child``, whose unguarded ``send_note`` waits for
  approval at the parent (the parent's default permissions cap the child).
- ``console_payments``: ``charge_card`` (idempotent) reports that it cannot tell whether the charge
  went through (EffectUnknown), so the call is parked for a person.
- ``console_keyed``: ``use_key`` needs the secret variable ``API_KEY``; the run waits for it.
- ``console_slow``: ``wait_for_go`` holds until :data:`GO` is set, so a page can watch the run finish.
- ``console_writer`` streams its reply slowly (live deltas), so a page can show it being written.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel

from threads_celery import Agent, EffectUnknown, Variable, agent_tool, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.runtime.schedules import Schedule, crontab
from threads_celery.testing import ScriptedModel, call, say

#: Markup that would run (or set window.__pwned) if a page rendered it as HTML.
PAYLOAD = "<script>window.__pwned='script'</script><img src=x onerror=\"window.__pwned='img'\"><b>bold</b>"
#: Set by a test to let ``wait_for_go`` return.
GO = threading.Event()
#: The notes ``send_note`` really sent (its arguments as approved).
SENT: list[str] = []


class NoteIn(BaseModel):
    text: str


class ChargeIn(BaseModel):
    amount: int


class NoInput(BaseModel):
    pass


def _send(inp: NoteIn, ctx: Any) -> str:
    SENT.append(inp.text)
    return f"sent {inp.text} {PAYLOAD}"


def _charge(inp: ChargeIn, ctx: Any) -> str:
    raise EffectUnknown(f"the gateway timed out charging {inp.amount}")


def _use_key(inp: NoInput, ctx: Any) -> str:
    return f"the key has {len(ctx.env('API_KEY'))} characters"


def _wait_for_go(inp: NoInput, ctx: Any) -> str:
    return "go" if GO.wait(60) else "no go"


send_note = tool(name="send_note", description="Send a note (unguarded).", input=NoteIn, execute=_send)
charge_card = tool(
    name="charge_card",
    description="Charge a card.",
    input=ChargeIn,
    execute=_charge,
    effect="idempotent",
    dedup_window_ms=60_000,
)
use_key = tool(
    name="use_key",
    description="Use the API key.",
    input=NoInput,
    execute=_use_key,
    effect="read_only",
    variables=[Variable("API_KEY", "secret", required=True)],
)
wait_for_go = tool(name="wait_for_go", description="Wait.", input=NoInput, execute=_wait_for_go, effect="read_only")

child = Agent(
    name="console_child",
    instructions="Send the note.",
    model=ScriptedModel([call("send_note", text=f"hello {PAYLOAD}"), say(f"child sent it {PAYLOAD}")]),
    tools=[send_note],
    permissions=Permissions.allow_all(),
)
parent = Agent(
    name="console_parent",
    instructions="Delegate.",
    model=ScriptedModel([call("helper", message="send the note"), say(f"parent done {PAYLOAD}")]),
    tools=[agent_tool(child, "Send notes.", name="helper")],
)
payments = Agent(
    name="console_payments",
    instructions="Charge.",
    model=ScriptedModel([call("charge_card", amount=5), say("charged")]),
    tools=[charge_card],
    permissions=Permissions.allow_all(),
)
keyed = Agent(
    name="console_keyed",
    instructions="Use the key.",
    model=ScriptedModel([call("use_key"), say("used the key")]),
    tools=[use_key],
)
slow = Agent(
    name="console_slow",
    instructions="Wait, then finish.",
    model=ScriptedModel([call("wait_for_go"), say("finished")]),
    tools=[wait_for_go],
)

#: Writes its reply slowly, as a provider streams it: a page can show the text while it is written.
LONG_REPLY = "The model writes this sentence slowly, a few characters at a time, so that it can be watched. " * 2
writer = Agent(
    name="console_writer",
    instructions="Write.",
    model=ScriptedModel([say(LONG_REPLY)], chunk_size=6, chunk_delay_s=0.1),
)

AGENTS = (parent, payments, keyed, slow, writer)

#: Shown on the console's agents page (the browser test loads this module as THREADS_AGENTS);
#: at 02:00 UTC it never fires during a test.
SCHEDULES = [Schedule("nightly-digest", "console_keyed", "Write the digest.", every=crontab(hour=2, minute=0))]
