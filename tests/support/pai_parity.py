"""Run one Pydantic AI agent plainly and durably, and say what its model saw.

:func:`seen` reduces the messages a ``FunctionModel`` function is given to what a model reads of
them (parts, tool names, contents, outcomes, and files as their media type and bytes), without the
ids and timestamps two runs never share, so the two runs' views can be compared as equal.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)


def shown(content: Any) -> Any:
    """A part's content as a model reads it: a file as its media type and bytes, the rest as is."""
    if isinstance(content, BinaryContent):
        return ("file", content.media_type, bytes(content.data))
    if isinstance(content, (list, tuple)):
        return [shown(c) for c in content]
    if isinstance(content, dict):
        return {k: shown(v) for k, v in content.items()}
    return content


def seen(messages: list[ModelMessage]) -> list[Any]:
    """What a model reads of ``messages``, part by part, in order."""
    out: list[Any] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    out.append(("system", part.content))
                elif isinstance(part, UserPromptPart):
                    out.append(("user", shown(part.content)))
                elif isinstance(part, ToolReturnPart):
                    out.append(("return", part.tool_name, shown(part.content), part.outcome))
                else:
                    out.append((type(part).__name__,))
        elif isinstance(message, ModelResponse):
            for rpart in message.parts:
                if isinstance(rpart, TextPart):
                    out.append(("text", rpart.content))
                elif isinstance(rpart, ToolCallPart):
                    args = json.loads(rpart.args) if isinstance(rpart.args, str) else rpart.args
                    out.append(("call", rpart.tool_name, args))
                else:
                    out.append((type(rpart).__name__,))
    return out


__all__ = ["seen", "shown"]
