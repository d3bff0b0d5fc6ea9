"""What a model is given of an MCP tool's content, plainly and durably, from one real MCP server.

The server (tests/support/mcp_content_server.py, the MCP SDK's server API over stdio) answers
with an image beside text, audio, an embedded text resource, an embedded PDF and resource links.
Plainly, each tool is a Pydantic AI function tool that calls the server through the MCP SDK's
client and returns what Pydantic AI's own MCP toolset makes of the result (``MCPToolset.call_tool``
returns ``pydantic_ai.mcp._map_mcp_call_tool_result(result)``; that module needs the FastMCP
client, which this project does not install, so :func:`pydantic_ai_mapping` restates it, and the
test spells out what it gives); durably, the same agent gets the server as
``from_pydantic_ai(..., mcp_servers=[MCPServer(...)])`` on the embedded runtime. The same
``FunctionModel`` calls every tool; what it was given after the calls must be equal: the image
and audio as files with their bytes, the embedded resources as their text and as a file, the
links as their URIs. A later run of the thread is given the same parts again, rebuilt from the
store.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp import types as mcp_types
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.support import mcp_content_server
from tests.support.pai_parity import seen
from tests.support.processes import REPO_ROOT
from threads_celery import MCPServer, Permissions, Settings, Threads, from_pydantic_ai

WAIT_S = 60.0
SERVER = StdioServerParameters(
    command=sys.executable,
    args=["-m", "tests.support.mcp_content_server"],
    env={"PYTHONPATH": str(REPO_ROOT)},
    cwd=str(REPO_ROOT),
)
CALLS = [
    ("chart", {"city": "Oslo"}),
    ("tone", {}),
    ("readme", {}),
    ("report", {}),
    ("find_files", {"pattern": "*.txt"}),
]
_names = itertools.count()


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded(settings=Settings(model_retries=0)) as runtime:
        yield runtime


def model(log: list[Any]) -> FunctionModel:
    """Calls every tool of the server in one reply, then answers; records what it was given."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        log.append(seen(messages))
        if len(log) == 1:
            return ModelResponse(parts=[ToolCallPart(name, dict(args)) for name, args in CALLS])
        return ModelResponse(parts=[TextPart("seen")])

    return FunctionModel(answer)


def pydantic_ai_mapping(result: mcp_types.CallToolResult) -> Any:
    """What Pydantic AI's MCP toolset returns for a result (``_map_mcp_call_tool_result``): its
    structured content when every part is text, else each part (JSON text as its data, an image or
    audio as a file, an embedded resource as its text or a file, a link as its URI), one part alone."""
    if result.structured_content is not None and all(isinstance(p, mcp_types.TextContent) for p in result.content):
        structured = result.structured_content
        return structured["result"] if set(structured) == {"result"} else structured
    mapped: list[Any] = []
    for part in result.content:
        if isinstance(part, mcp_types.TextContent):
            text: Any = part.text
            if part.text.startswith(("[", "{")):
                with contextlib.suppress(ValueError):
                    text = json.loads(part.text)
            mapped.append(text)
        elif isinstance(part, (mcp_types.ImageContent, mcp_types.AudioContent)):
            mapped.append(
                BinaryContent.narrow_type(BinaryContent(base64.b64decode(part.data), media_type=part.mime_type))
            )
        elif isinstance(part, mcp_types.EmbeddedResource):
            resource = part.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                mapped.append(resource.text)
            else:
                media_type = resource.mime_type or "application/octet-stream"
                mapped.append(
                    BinaryContent.narrow_type(BinaryContent(base64.b64decode(resource.blob), media_type=media_type))
                )
        else:
            mapped.append(str(part.uri))
    return mapped[0] if len(mapped) == 1 else mapped


def plain_agent(log: list[Any]) -> PydanticAgent[None, str]:
    agent = PydanticAgent(model(log))

    async def call(name: str, args: dict[str, Any]) -> Any:
        async with Client(SERVER) as client:
            return pydantic_ai_mapping(await client.call_tool(name, args))

    @agent.tool_plain
    async def chart(city: str) -> Any:
        return await call("chart", {"city": city})

    @agent.tool_plain
    async def tone() -> Any:
        return await call("tone", {})

    @agent.tool_plain
    async def readme() -> Any:
        return await call("readme", {})

    @agent.tool_plain
    async def report() -> Any:
        return await call("report", {})

    @agent.tool_plain
    async def find_files(pattern: str) -> Any:
        return await call("find_files", {"pattern": pattern})

    return agent


def returns(view: list[Any]) -> list[Any]:
    return [part for part in view if part[0] == "return"]


def test_the_model_is_given_mcp_files_resources_and_links_as_plain_pydantic_ai_gives_them(threads: Threads) -> None:
    plain_log: list[Any] = []
    assert plain_agent(plain_log).run_sync("Show me everything").output == "seen"
    expected = returns(plain_log[1])
    assert expected == [
        ("return", "chart", ["chart of Oslo", ("file", "image/png", mcp_content_server.PNG)], "success"),
        ("return", "tone", ("file", "audio/wav", mcp_content_server.WAV), "success"),
        ("return", "readme", mcp_content_server.README, "success"),
        ("return", "report", ("file", "application/pdf", mcp_content_server.PDF), "success"),
        ("return", "find_files", ["file:///notes/a.txt", "file:///notes/b.txt"], "success"),
    ]

    durable_log: list[Any] = []
    server = MCPServer("content", command=SERVER.command, args=list(SERVER.args), env=SERVER.env, cwd=str(REPO_ROOT))
    agent = from_pydantic_ai(
        PydanticAgent(model(durable_log)),
        name=f"mcp_content_{next(_names)}",
        mcp_servers=[server],
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "Show me everything")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert returns(durable_log[1]) == expected
    assert durable_log[1] == plain_log[1]

    # Stored as JSON the store keeps, and rebuilt into the same parts for the thread's next run.
    [stored] = [
        m.tool_result for m in threads.messages(handle.thread_id) if m.tool_result and m.tool_result.name == "chart"
    ]
    assert stored is not None and stored.kind == "content" and "image/png" in stored.content
    durable_log.clear()
    again = threads.wait(threads.start(agent, "Once more", thread_id=handle.thread_id).run_id, WAIT_S)
    assert again.status == "completed", again.error
    assert returns(durable_log[0]) == expected
