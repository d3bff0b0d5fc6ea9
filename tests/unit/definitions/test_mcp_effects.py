"""MCP tools: the pure effect decision from annotations, and MCPServer's configuration errors.

No MCP server runs here; tests/integration/test_mcp_tools.py runs real ones.
"""

from __future__ import annotations

import pytest

from threads_celery import ConfigError, MCPServer
from threads_celery.decisions.effects import NotFound, Reconcile
from threads_celery.definitions.mcp_servers import (
    Hints,
    decide_tool_effect,
    describe_failure,
    effect_from_hints,
)
from threads_celery.definitions.schema_tools import stated_effect


@pytest.mark.parametrize(
    ("hints", "effect"),
    [
        (Hints(), "unguarded"),
        (Hints(read_only=False, idempotent=False), "unguarded"),
        (Hints(read_only=True), "read_only"),
        (Hints(read_only=True, idempotent=True), "read_only"),
        (Hints(idempotent=True), "idempotent"),
        (Hints(read_only=False, idempotent=True), "idempotent"),
        (Hints(read_only=None, idempotent=None), "unguarded"),
    ],
)
def test_effect_from_hints(hints: Hints, effect: str) -> None:
    assert effect_from_hints(hints) == effect


def test_an_idempotent_hint_takes_the_authors_window() -> None:
    assert decide_tool_effect("s", "set_flag", Hints(idempotent=True), None, 5000) == (
        "idempotent",
        5000,
        None,
    )
    assert decide_tool_effect("s", "set_flag", Hints(idempotent=True), None, {"set_flag": 7}) == (
        "idempotent",
        7,
        None,
    )


def test_an_idempotent_hint_without_a_window_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="dedup_window_ms"):
        decide_tool_effect("s", "set_flag", Hints(idempotent=True), None, None)
    with pytest.raises(ConfigError, match="dedup_window_ms"):
        decide_tool_effect("s", "set_flag", Hints(idempotent=True), None, {"other": 5})


def test_the_authors_effect_wins_over_the_annotations() -> None:
    assert decide_tool_effect("s", "t", Hints(read_only=True), "unguarded", None) == (
        "unguarded",
        None,
        None,
    )
    assert decide_tool_effect("s", "t", Hints(), "read_only", None) == ("read_only", None, None)
    reconcile = Reconcile(finality="final", lookup=lambda key: NotFound())
    assert decide_tool_effect("s", "t", Hints(), reconcile, None) == (
        "reconcilable",
        None,
        reconcile,
    )


def test_a_bad_stated_effect_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="must be one of"):
        stated_effect("agent 'a'", "t", "harmless", None)
    with pytest.raises(ConfigError, match="Reconcile"):
        stated_effect("agent 'a'", "t", "reconcilable", None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of command"),
        ({"command": "x", "url": "http://h/mcp"}, "exactly one of command"),
        ({"url": "ftp://h/mcp"}, "http:// or https://"),
        ({"command": "x", "args": "--flag"}, "list of strings"),
        ({"command": "x", "timeout_s": 0}, "positive number"),
        ({"command": "x", "timeout_s": True}, "positive number"),
        ({"command": "x", "prefix": "bad prefix"}, "prefix"),
    ],
)
def test_mcp_server_options_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MCPServer(**kwargs)  # type: ignore[arg-type]


def test_a_server_that_cannot_start_is_a_config_error_naming_it() -> None:
    server = MCPServer("missing", command="/nonexistent/mcp-server-binary", timeout_s=5)
    with pytest.raises(ConfigError, match="cannot list the tools of MCP server 'missing'"):
        server.tools()


def test_describe_failure_names_timeouts_and_closed_connections_without_tracebacks() -> None:
    assert describe_failure(TimeoutError(), 3) == "did not answer within 3 s"
    grouped = ExceptionGroup("tg", [ExceptionGroup("inner", [RuntimeError("Connection closed")])])
    assert describe_failure(grouped, 3) == "closed the connection (the server process may have died)"
    assert describe_failure(OSError("boom"), 3) == "failed (OSError: boom)"


def test_a_servers_default_name_shows_no_credentials_from_its_url() -> None:
    server = MCPServer(url="https://user:s3cret@mcp.example.com:8443/mcp?token=abc")
    assert server.name == "https://mcp.example.com:8443/mcp"
    assert "s3cret" not in repr(server) and "abc" not in repr(server)


def test_a_tool_with_a_recursive_input_schema_is_a_config_error_naming_it() -> None:
    from threads_celery.definitions.mcp_schemas import json_schema_validator

    tree = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
        },
    }
    with pytest.raises(
        ConfigError, match=r"'files'.*'make_tree' has a recursive input schema \(#/\$defs/Node -> #/\$defs/Node\)"
    ):
        json_schema_validator("files", "make_tree", tree)
    flat = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "string"}}}
    assert json_schema_validator("files", "flat", flat)({"a": "x"}) == {"a": "x"}
