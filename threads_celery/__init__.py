"""threads-celery: a durable agent runtime on Celery and PostgreSQL.

Names are imported lazily, so ``import threads_celery.client`` in a web app pulls in neither the
model layer nor any tool code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "tool": "tools",
    "Tool": "tools",
    "Agent": "agents",
    "MCPServer": "mcp_servers",
    "from_pydantic_ai": "pydantic_ai_adapter",
    "ToolContext": "context",
    "Reconcile": "effects",
    "Found": "effects",
    "NotFound": "effects",
    "LookupUnknown": "effects",
    "Threads": "client",
    "agent_tool": "agent_tools",
    "Detached": "agent_tools",
    "AgentToolFailure": "agent_tools",
    "AgentToolResult": "agent_tools",
    "Permissions": "permissions",
    "Allow": "hooks",
    "Deny": "hooks",
    "Modify": "hooks",
    "HookCall": "hooks",
    "HookContext": "hooks",
    "HookResult": "hooks",
    "Stop": "hooks",
    "Variable": "variables",
    "Prompt": "prompts",
    "SubagentRelationship": "subagents",
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
}

# Written out (not computed from _EXPORTS) so type checkers and linters can read it; a unit
# test keeps the two in step.
__all__ = [
    "Agent",
    "AgentToolFailure",
    "AgentToolResult",
    "Allow",
    "BrokerUnavailable",
    "ConfigError",
    "Deny",
    "Detached",
    "EffectUnknown",
    "Found",
    "HookCall",
    "HookContext",
    "HookResult",
    "LookupUnknown",
    "MCPServer",
    "Message",
    "Modify",
    "NotFound",
    "PayloadTooLarge",
    "Permissions",
    "Prompt",
    "Reconcile",
    "Run",
    "RunHandle",
    "RunNotFound",
    "RunTimeout",
    "Settings",
    "Stop",
    "StoreUnavailable",
    "SubagentRelationship",
    "Threads",
    "ThreadsError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "UnknownAgent",
    "Variable",
    "agent_tool",
    "from_pydantic_ai",
    "tool",
]

if TYPE_CHECKING:  # names for type checkers; at run time __getattr__ imports them lazily
    from .agent_tools import AgentToolFailure, AgentToolResult, Detached, agent_tool
    from .agents import Agent
    from .client import Threads
    from .context import ToolContext
    from .effects import Found, LookupUnknown, NotFound, Reconcile
    from .exceptions import (
        BrokerUnavailable,
        ConfigError,
        EffectUnknown,
        PayloadTooLarge,
        RunNotFound,
        RunTimeout,
        StoreUnavailable,
        ThreadsError,
        UnknownAgent,
    )
    from .hooks import Allow, Deny, HookCall, HookContext, HookResult, Modify, Stop
    from .mcp_servers import MCPServer
    from .permissions import Permissions
    from .prompts import Prompt
    from .pydantic_ai_adapter import from_pydantic_ai
    from .records import Message, Run, RunHandle, ToolCall, ToolResult
    from .settings import Settings
    from .subagents import SubagentRelationship
    from .tools import Tool, tool
    from .variables import Variable


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'threads_celery' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
