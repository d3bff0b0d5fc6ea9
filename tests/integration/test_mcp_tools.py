"""MCP tools end to end against a real MCP server process (the SDK's server API), over stdio and
streamable HTTP, on the embedded runtime (SQLite and the in-process Celery worker).

The server (tests/support/mcp_test_server.py) writes a line to a ledger file for every effect,
so each test can tell how many times a side effect really happened. A real worker on PostgreSQL
and Redis runs MCP calls in tests/integration/test_adapters_worker.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mcp_servers import http_server_process, ledger_lines, stdio_server
from threads_celery import Agent, ConfigError, MCPServer, Settings, Threads
from threads_celery.decisions.permissions import Permissions
from threads_celery.records import Message
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 60.0
HANG_TIMEOUT_S = 3.0
_names = itertools.count()


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded(settings=Settings(model_retries=0)) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def module_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "effects.log"


@pytest.fixture
def ledger(module_ledger: Path) -> Path:
    """The effects file of the shared server, emptied for each test."""
    module_ledger.write_text("")
    return module_ledger


@pytest.fixture(scope="module")
def server(module_ledger: Path) -> MCPServer:
    """The test server over stdio, listed once for the module (each call starts it anew)."""
    return stdio_server(module_ledger, timeout_s=HANG_TIMEOUT_S)


def agent_with(server: MCPServer, *replies: object, permissions: Permissions | None = None) -> Agent:
    return Agent(
        f"mcp_agent_{next(_names)}",
        "Use the tools.",
        ScriptedModel(list(replies)),  # type: ignore[arg-type]
        mcp_servers=[server],
        permissions=permissions,
    )


def tool_results(threads: Threads, thread_id: str) -> list[Message]:
    return [m for m in threads.messages(thread_id) if m.role == "tool"]


# -- the tool list ------------------------------------------------------------------------------


def test_annotations_pick_each_tools_effect(server: MCPServer) -> None:
    effects = {t.name: (t.effect, t.dedup_window_ms) for t in server.tools()}
    assert effects["lookup_city"] == ("read_only", None)
    assert effects["set_flag"] == ("idempotent", 60_000)
    assert effects["send_note"] == ("unguarded", None)
    lookup = next(t for t in server.tools() if t.name == "lookup_city")
    assert lookup.parameters_json_schema()["required"] == ["city"]


def test_the_authors_effects_override_the_annotations(ledger: Path) -> None:
    server = stdio_server(ledger, effects={"send_note": "read_only", "lookup_city": "unguarded"})
    effects = {t.name: t.effect for t in server.tools()}
    assert effects["send_note"] == "read_only"
    assert effects["lookup_city"] == "unguarded"


def test_an_idempotent_tool_without_a_window_is_a_config_error_naming_it() -> None:
    server = stdio_server(dedup_window_ms=None)
    with pytest.raises(ConfigError, match=r"'set_flag'.*idempotentHint.*dedup_window_ms"):
        server.tools()


def test_include_and_prefix_pick_and_name_the_tools(threads: Threads, ledger: Path) -> None:
    # The server's idempotent tools are left out, so no dedup window is needed.
    server = stdio_server(ledger, include=["lookup_city", "send_note"], prefix="town", dedup_window_ms=None)
    assert [t.name for t in server.tools()] == ["town_lookup_city", "town_send_note"]
    agent = agent_with(server, call("town_lookup_city", city="Metz"), say("done"))
    handle = threads.start(agent, "Metz?")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [result] = tool_results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.content == "Metz: 2100000 people"
    with pytest.raises(ConfigError, match="lists no tool named 'nope'"):
        stdio_server(include=["nope"]).tools()


def test_an_effect_for_a_tool_the_server_does_not_list_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="lists no tool named 'sendnote'"):
        stdio_server(effects={"sendnote": "read_only"}).tools()


def test_the_tool_list_is_pinned_with_the_threads_configuration(
    threads: Threads, ledger: Path, server: MCPServer
) -> None:
    name = f"mcp_pinned_{next(_names)}"
    before = Agent(name, "Use the tools.", ScriptedModel([say("ok")]), mcp_servers=[server])
    after = Agent(
        name,
        "Use the tools.",
        ScriptedModel([say("ok")]),
        mcp_servers=[stdio_server(ledger, extra_tool=True)],
    )
    assert "extra_lookup" in [t.name for t in after.tools]
    assert before.config_hash() != after.config_hash()
    handle = threads.start(before, "hello")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    with pytest.raises(ConfigError):
        threads.start(after, "again", thread_id=handle.thread_id)


# -- calls over stdio ---------------------------------------------------------------------------


def test_a_read_only_mcp_tool_runs_without_asking(threads: Threads, ledger: Path, server: MCPServer) -> None:
    agent = agent_with(server, call("lookup_city", city="Paris"), say("done"))
    handle = threads.start(agent, "How many people live in Paris?")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [result] = tool_results(threads, handle.thread_id)
    assert result.tool_result is not None
    assert result.tool_result.content == "Paris: 2100000 people"
    assert not result.tool_result.is_error


def test_an_unannotated_mcp_tool_asks_first_then_runs_once(threads: Threads, ledger: Path, server: MCPServer) -> None:
    agent = agent_with(server, call("send_note", to="ann", text="hi"), say("sent"))
    handle = threads.start(agent, "Tell Ann hi")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "awaiting_approval"
    assert ledger_lines(ledger) == []  # nothing was sent before the approval
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert pending.tool == "send_note"
    threads.approve(pending.effect_key, principal="tester")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert ledger_lines(ledger) == ["send_note ann: hi"]
    assistant = [m for m in threads.messages(handle.thread_id) if m.tool_calls]
    assert assistant[0].tool_calls[0].effect_key == pending.effect_key


def test_the_calls_effect_key_reaches_the_server_in_meta(threads: Threads, ledger: Path, server: MCPServer) -> None:
    agent = agent_with(server, call("echo_effect_key"), say("done"))
    handle = threads.start(agent, "Which key?")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [result] = tool_results(threads, handle.thread_id)
    [request] = [c for m in threads.messages(handle.thread_id) for c in m.tool_calls]
    assert result.tool_result is not None
    assert result.tool_result.content == request.effect_key


def test_an_overridden_effect_changes_the_permission_check(threads: Threads, ledger: Path) -> None:
    server = stdio_server(ledger, effects={"send_note": "read_only"})
    agent = agent_with(server, call("send_note", to="bo", text="x"), say("sent"))
    handle = threads.start(agent, "Tell Bo")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert ledger_lines(ledger) == ["send_note bo: x"]


def test_arguments_that_fail_the_servers_schema_never_reach_it(
    threads: Threads, ledger: Path, server: MCPServer
) -> None:
    agent = agent_with(
        server,
        call("send_note", to="ann"),  # no text
        say("gave up"),
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "Tell Ann")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [result] = tool_results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.is_error
    assert "invalid arguments" in result.tool_result.content and "'text'" in result.tool_result.content
    assert ledger_lines(ledger) == []


def test_an_error_result_from_the_server_is_a_tool_error(threads: Threads, ledger: Path, server: MCPServer) -> None:
    agent = agent_with(server, call("broken_lookup", city="Oslo"), say("no data"))
    handle = threads.start(agent, "Oslo?")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [result] = tool_results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.is_error
    assert result.tool_result.content.startswith("MCPToolFailed: ")


# -- a server that dies, hangs or answers garbage mid-call --------------------------------------


@pytest.mark.parametrize(
    ("tool_name", "why"),
    [
        ("die_reading", "closed the connection"),
        ("hang_reading", f"did not answer within {HANG_TIMEOUT_S:g} s"),
        ("garbage_reading", "did not answer within"),
    ],
)
def test_a_read_only_call_whose_server_fails_mid_call_is_a_tool_error(
    threads: Threads, ledger: Path, tool_name: str, why: str, server: MCPServer
) -> None:
    agent = agent_with(server, call(tool_name), say("could not tell"))
    handle = threads.start(agent, "Go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [result] = tool_results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.is_error
    assert why in result.tool_result.content
    assert "whether the tool acted is unknown" in result.tool_result.content


@pytest.mark.parametrize(
    ("tool_name", "args", "effect_line"),
    [
        ("die_after_sending", {"to": "cy"}, "die_after_sending cy"),
        ("hang_setting", {"name": "lamp"}, "hang_setting lamp"),
        ("garbage_sending", {"to": "di"}, "garbage_sending di"),
    ],
)
def test_a_non_read_only_call_whose_server_fails_mid_call_parks(
    threads: Threads,
    ledger: Path,
    tool_name: str,
    args: dict[str, str],
    effect_line: str,
    server: MCPServer,
) -> None:
    agent = agent_with(server, call(tool_name, args), say("unreachable"), permissions=Permissions.allow_all())
    handle = threads.start(agent, "Go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "parked"
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert pending.status == "parked"
    assert pending.tool == tool_name
    assert "whether the tool acted is unknown" in pending.reason
    assert ledger_lines(ledger) == [effect_line]  # it happened once and was not repeated
    threads.resolve(pending.effect_key, "assume_done", principal="tester")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert ledger_lines(ledger) == [effect_line]


# -- streamable HTTP ----------------------------------------------------------------------------


def test_mcp_tools_over_streamable_http(threads: Threads, ledger: Path) -> None:
    with http_server_process(ledger) as url:
        server = MCPServer(
            "test-http",
            url=url,
            headers={"Authorization": "Bearer not-a-real-token"},
            dedup_window_ms=10_000,
            timeout_s=HANG_TIMEOUT_S,
        )
        effects = {t.name: t.effect for t in server.tools()}
        assert (effects["lookup_city"], effects["set_flag"], effects["send_note"]) == (
            "read_only",
            "idempotent",
            "unguarded",
        )
        agent = agent_with(
            server,
            call("lookup_city", city="Lyon"),
            call("send_note", to="ed", text="over http"),
            call("hang_reading"),
            say("done"),
        )
        handle = threads.start(agent, "Go")
        assert threads.wait(handle.run_id, WAIT_S).status == "awaiting_approval"
        [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
        threads.approve(pending.effect_key, principal="tester")
        run = threads.wait(handle.run_id, WAIT_S)
        assert run.status == "completed", run.error
    contents = [m.tool_result for m in tool_results(threads, handle.thread_id)]
    assert [c.content for c in contents if c is not None][:2] == [
        "Lyon: 2100000 people",
        "sent to ed",
    ]
    assert contents[2] is not None and contents[2].is_error
    assert "did not answer within" in contents[2].content
    assert ledger_lines(ledger) == ["send_note ed: over http"]


def test_a_call_that_never_reached_the_server_is_a_tool_error_even_when_unguarded(
    threads: Threads, ledger: Path
) -> None:
    with http_server_process(ledger) as url:
        server = MCPServer("test-http", url=url, dedup_window_ms=10_000, timeout_s=HANG_TIMEOUT_S)
        server.tools()  # listed while the server is up
    # The server is gone: nothing can have been sent, so there is nothing for a person to settle.
    agent = agent_with(
        server,
        call("send_note", to="fay", text="x"),
        say("down"),
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "Go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    [result] = tool_results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.is_error
    assert result.tool_result.content.startswith("MCPUnreachable: MCP server 'test-http' could not be reached")
    assert ledger_lines(ledger) == []


def test_an_http_server_that_dies_mid_call_parks_the_unguarded_call(threads: Threads, ledger: Path) -> None:
    with http_server_process(ledger) as url:
        server = MCPServer("test-http", url=url, dedup_window_ms=10_000, timeout_s=HANG_TIMEOUT_S)
        agent = agent_with(
            server,
            call("die_after_sending", to="ivy"),
            say("gone"),
            permissions=Permissions.allow_all(),
        )
        handle = threads.start(agent, "Go")
        run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "parked", run.error
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert "whether the tool acted is unknown" in pending.reason
    assert ledger_lines(ledger) == ["die_after_sending ivy"]


def test_an_adapted_pydantic_ai_agent_takes_mcp_servers(threads: Threads, ledger: Path, server: MCPServer) -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from threads_celery import from_pydantic_ai

    def look_up_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("lookup_city", {"city": "Nice"})])
        return ModelResponse(parts=[TextPart(f"found: {returned[0].content}")])

    source = PydanticAgent(FunctionModel(look_up_then_answer), name=f"pai_mcp_{next(_names)}")
    agent = from_pydantic_ai(source, mcp_servers=[server])
    assert "lookup_city" in [t.name for t in agent.tools]
    run = threads.wait(threads.start(agent, "Nice?").run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert run.output == "found: Nice: 2100000 people"
