"""What the model is given of an MCP tool's result: its content blocks as Pydantic AI gives them
(text as text or as the JSON it holds, images and audio as files with their bytes, an embedded
resource as its text or a file, a resource link as its URI), or as text where only text fits.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from threads_celery.definitions.tools import ToolContent

if TYPE_CHECKING:
    from mcp.types import CallToolResult


def call_result_content(result: CallToolResult) -> str:
    """What the model is given of an MCP tool's result, as Pydantic AI gives it: text as text (its
    structured content as JSON when it has no text), and a result with anything but text as its
    parts (:class:`~threads_celery.definitions.tools.ToolContent`): an image or audio as a file
    with its bytes, an embedded resource as its text (or a file, for a blob), a resource link as its
    URI."""
    blocks = list(result.content)
    if all(getattr(block, "type", None) == "text" for block in blocks):
        return render_call_result(result)
    parts = [block_content(block) for block in blocks]
    return ToolContent.of(parts[0] if len(parts) == 1 else parts)


def block_content(block: Any) -> Any:
    """One content block of an MCP result as a part of Pydantic AI's tool-return content."""
    from pydantic_ai.messages import BinaryContent  # the pydantic-ai the agent's model runs on

    kind = getattr(block, "type", None)
    if kind == "text":
        text = str(block.text)
        if text.startswith(("[", "{")):  # JSON text is given as the data it holds, as Pydantic AI does
            try:
                return json.loads(text)
            except ValueError:
                pass
        return text
    if kind in ("image", "audio"):
        return BinaryContent.narrow_type(BinaryContent(data=base64.b64decode(block.data), media_type=block.mime_type))
    if kind == "resource":
        resource = block.resource
        if getattr(resource, "blob", None) is not None:
            media_type = getattr(resource, "mime_type", None) or "application/octet-stream"
            return BinaryContent.narrow_type(BinaryContent(data=base64.b64decode(resource.blob), media_type=media_type))
        return str(getattr(resource, "text", ""))
    if kind == "resource_link":
        return str(block.uri)
    return f"[{kind} content]"


def render_call_result(result: CallToolResult) -> str:
    """An MCP tool's result as text: its text, else its structured content as JSON (an error's
    message; a result with more than text is given to the model by :func:`call_result_content`)."""
    texts: list[str] = []
    others: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "content")
        if kind == "text":
            texts.append(str(getattr(block, "text", "")))
        else:
            others.append(
                f"[{kind} {getattr(block, 'mime_type', None) or getattr(block, 'uri', '')}]".replace(" ]", "]")
            )
    if texts or others:
        return "\n".join([*texts, *others])
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    return ""


__all__ = ["block_content", "call_result_content", "render_call_result"]
