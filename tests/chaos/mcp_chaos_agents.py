"""Agents whose one MCP call a chaos test interrupts (loaded next to tests.chaos.chaos_agents).

One agent per effect, each calling ``slow_once`` on the test MCP server over stdio, with the
effect stated by the author (``effects={...}``). The server writes its ledger to
``MCP_TEST_LEDGER``, which the test gives the workers it starts; the ref of each agent's call is
its effect (each agent runs once per test module).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.mcp_servers import stdio_server
from threads_celery import Agent
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call, say

_ledger = os.environ.get("MCP_TEST_LEDGER")
LEDGER = Path(_ledger) if _ledger else None
EFFECTS = ("read_only", "idempotent", "unguarded")


def _agent(effect: str) -> Agent:
    server = stdio_server(LEDGER, name=f"chaos-{effect}", effects={"slow_once": effect}, dedup_window_ms=120_000)
    return Agent(
        f"mcp_chaos_{effect}",
        "Call slow_once.",
        ScriptedModel([call("slow_once", ref=effect), say("done")]),
        mcp_servers=[server],
        permissions=Permissions.allow_all(),
    )


AGENTS = {effect: _agent(effect) for effect in EFFECTS}
# A worker registers the Agent values it finds at the module's top level.
mcp_chaos_read_only = AGENTS["read_only"]
mcp_chaos_idempotent = AGENTS["idempotent"]
mcp_chaos_unguarded = AGENTS["unguarded"]
