"""Agents with MCP tools for the real-worker tests (THREADS_AGENTS loads this module).

The test MCP server records its effects in the file named by ``MCP_TEST_LEDGER``, which the
test sets before the worker starts (the worker inherits it).
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

mcp_notes = Agent(
    "mcp_worker_notes",
    "Use the tools.",
    ScriptedModel(
        [
            call("lookup_city", city="Oslo"),
            call("send_note", to="gus", text="from a worker"),
            say("done"),
        ]
    ),
    mcp_servers=[stdio_server(LEDGER, timeout_s=5)],
)

mcp_dies = Agent(
    "mcp_worker_dies",
    "Use the tools.",
    ScriptedModel([call("die_after_sending", to="hal"), say("unreachable")]),
    mcp_servers=[stdio_server(LEDGER, timeout_s=5)],
    permissions=Permissions.allow_all(),
)
