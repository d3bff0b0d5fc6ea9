"""threads-celery: a durable agent runtime on Celery and PostgreSQL.

Names are imported lazily, so ``import threads_celery.client.threads`` in a web app pulls in neither the
model layer nor any tool code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "tool": "definitions.tools",
    "Tool": "definitions.tools",
    "Agent": "definitions.agents",
    "MCPServer": "definitions.mcp_servers",
    "from_pydantic_ai": "definitions.pydantic_ai_adapter",
    "ToolContext": "definitions.context",
    "Reconcile": "decisions.effects",
    "Found": "decisions.effects",
    "NotFound": "decisions.effects",
    "LookupUnknown": "decisions.effects",
    "Threads": "client.threads",
    "agent_tool": "definitions.agent_tools",
    "Detached": "definitions.agent_tools",
    "AgentToolFailure": "records",
    "AgentToolResult": "records",
    "Permissions": "decisions.permissions",
    "Allow": "definitions.hooks",
    "Deny": "definitions.hooks",
    "Modify": "definitions.hooks",
    "HookCall": "definitions.hooks",
    "HookContext": "definitions.hooks",
    "HookResult": "definitions.hooks",
    "Stop": "definitions.hooks",
    "Variable": "definitions.variables",
    "Prompt": "definitions.prompts",
    "SubagentRelationship": "definitions.agents",
    "Settings": "settings",
    "Message": "records",
    "ToolCall": "records",
    "ToolResult": "records",
    "Run": "records",
    "RunHandle": "records",
    "ConfigError": "exceptions",
    "ThreadsError": "exceptions",
    "UnknownAgent": "exceptions",
    "RunNotFound": "exceptions",
    "RunTimeout": "exceptions",
    "PayloadTooLarge": "exceptions",
    "StoreUnavailable": "exceptions",
    "BrokerUnavailable": "exceptions",
    "EffectUnknown": "exceptions",
    "Schedule": "runtime.schedules",
    "crontab": "runtime.schedules",
    "UsageLimits": "decisions.usage",
    "Limits": "decisions.usage",
    "UsageTotals": "records",
    "AgentToolRun": "records",
    "Branch": "records",
    "PriorEffect": "records",
    "ThreadBusy": "exceptions",
    "BranchPointNotFound": "exceptions",
    "install": "worker.own_app",
}

# Written out (not computed from _EXPORTS) so type checkers and linters can read it; a unit
# test keeps the two in step.
__all__ = [
    "Agent",
    "AgentToolFailure",
    "AgentToolResult",
    "AgentToolRun",
    "Allow",
    "Branch",
    "BranchPointNotFound",
    "BrokerUnavailable",
    "ConfigError",
    "Deny",
    "Detached",
    "EffectUnknown",
    "Found",
    "HookCall",
    "HookContext",
    "HookResult",
    "Limits",
    "LookupUnknown",
    "MCPServer",
    "Message",
    "Modify",
    "NotFound",
    "PayloadTooLarge",
    "Permissions",
    "PriorEffect",
    "Prompt",
    "Reconcile",
    "Run",
    "RunHandle",
    "RunNotFound",
    "RunTimeout",
    "Schedule",
    "Settings",
    "Stop",
    "StoreUnavailable",
    "SubagentRelationship",
    "ThreadBusy",
    "Threads",
    "ThreadsError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "UnknownAgent",
    "UsageLimits",
    "UsageTotals",
    "Variable",
    "agent_tool",
    "crontab",
    "from_pydantic_ai",
    "install",
    "tool",
]

if TYPE_CHECKING:  # names for type checkers; at run time __getattr__ imports them lazily
    from threads_celery.client.threads import Threads
    from threads_celery.decisions.effects import Found, LookupUnknown, NotFound, Reconcile
    from threads_celery.decisions.permissions import Permissions
    from threads_celery.decisions.usage import Limits, UsageLimits
    from threads_celery.definitions.agent_tools import Detached, agent_tool
    from threads_celery.definitions.agents import Agent, SubagentRelationship
    from threads_celery.definitions.context import ToolContext
    from threads_celery.definitions.hooks import Allow, Deny, HookCall, HookContext, HookResult, Modify, Stop
    from threads_celery.definitions.mcp_servers import MCPServer
    from threads_celery.definitions.prompts import Prompt
    from threads_celery.definitions.pydantic_ai_adapter import from_pydantic_ai
    from threads_celery.definitions.tools import Tool, tool
    from threads_celery.definitions.variables import Variable
    from threads_celery.exceptions import (
        BranchPointNotFound,
        BrokerUnavailable,
        ConfigError,
        EffectUnknown,
        PayloadTooLarge,
        RunNotFound,
        RunTimeout,
        StoreUnavailable,
        ThreadBusy,
        ThreadsError,
        UnknownAgent,
    )
    from threads_celery.records import (
        AgentToolFailure,
        AgentToolResult,
        AgentToolRun,
        Branch,
        Message,
        PriorEffect,
        Run,
        RunHandle,
        ToolCall,
        ToolResult,
        UsageTotals,
    )
    from threads_celery.runtime.schedules import Schedule, crontab
    from threads_celery.settings import Settings
    from threads_celery.worker.own_app import install


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'threads_celery' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
