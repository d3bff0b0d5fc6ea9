"""A real MCP server (the MCP SDK's server API, FastMCP before SDK 2) whose tools answer with more than text.

Run as ``python -m tests.support.mcp_content_server`` (stdio). Each tool answers with one kind of
MCP content: an image beside text, audio, an embedded text resource, an embedded binary resource,
and resource links, so a test can compare what a model is given of each.
"""

from __future__ import annotations

import base64

from mcp.server.mcpserver import MCPServer
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

#: A 1x1 PNG: the bytes a model must be given, unchanged.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPj/HwADAgH/p+2J0wAAAABJRU5ErkJggg=="
)
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
PDF = b"%PDF-1.4 tiny"
README = "# Notes\nThe office opens at nine."

server = MCPServer("threads-content-tools")
READ_ONLY = ToolAnnotations(read_only_hint=True)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@server.tool(annotations=READ_ONLY)
def chart(city: str) -> list[ContentBlock]:
    """Draw a city's temperatures as a chart."""
    return [
        TextContent(type="text", text=f"chart of {city}"),
        ImageContent(type="image", data=_b64(PNG), mime_type="image/png"),
    ]


@server.tool(annotations=READ_ONLY)
def tone() -> list[ContentBlock]:
    """Play the alert tone."""
    return [AudioContent(type="audio", data=_b64(WAV), mime_type="audio/wav")]


@server.tool(annotations=READ_ONLY)
def readme() -> list[ContentBlock]:
    """Read the notes file."""
    resource = TextResourceContents(uri="file:///notes/README.md", mime_type="text/markdown", text=README)
    return [EmbeddedResource(type="resource", resource=resource)]


@server.tool(annotations=READ_ONLY)
def report() -> list[ContentBlock]:
    """Fetch the report as a PDF."""
    resource = BlobResourceContents(uri="file:///notes/report.pdf", mime_type="application/pdf", blob=_b64(PDF))
    return [EmbeddedResource(type="resource", resource=resource)]


@server.tool(annotations=READ_ONLY)
def find_files(pattern: str) -> list[ContentBlock]:
    """List the files whose names match a pattern, as links."""
    return [
        ResourceLink(type="resource_link", name="a.txt", uri="file:///notes/a.txt", mime_type="text/plain"),
        ResourceLink(type="resource_link", name="b.txt", uri="file:///notes/b.txt", mime_type="text/plain"),
    ]


if __name__ == "__main__":
    server.run("stdio")
