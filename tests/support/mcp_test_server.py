"""A real MCP server for the tests, written with the MCP SDK's server API.

Run as ``python -m tests.support.mcp_test_server stdio`` or
``python -m tests.support.mcp_test_server http PORT``. Each tool that changes something appends
one line to the file named by ``MCP_TEST_LEDGER`` (when set), so a test can count how many times
an effect really happened. ``MCP_TEST_EXTRA_TOOL=1`` adds a tool, to show a changed tool list.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations
from mcp_types import INVALID_PARAMS

server = MCPServer("threads-test-tools")


def _record(line: str) -> None:
    ledger = os.environ.get("MCP_TEST_LEDGER")
    if ledger:
        with open(ledger, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_city(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 2100000 people"


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def set_flag(name: str, value: bool) -> str:
    """Set a named flag to a value."""
    _record(f"set_flag {name}={value}")
    return f"flag {name} is {value}"


@server.tool()
def send_note(to: str, text: str) -> str:
    """Send a note to someone."""
    _record(f"send_note {to}: {text}")
    return f"sent to {to}"


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
def reset_flags(scope: str) -> str:
    """Clear every flag in a scope (idempotent, and destructive: what was there is gone)."""
    _record(f"reset_flags {scope}")
    return f"flags of {scope} cleared"


@server.tool()
def refuse_params(to: str) -> str:
    """An unguarded tool whose server refuses the request with a JSON-RPC error (invalid params)."""
    raise MCPError(code=INVALID_PARAMS, message=f"invalid params: {to!r} is not a known recipient")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def server_pid() -> str:
    """The process id of the server answering (a new one each time the server is started)."""
    return str(os.getpid())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def broken_lookup(city: str) -> str:
    """A lookup that always fails on the server's side."""
    raise ValueError(f"no data for {city}")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def die_reading() -> str:
    """A read-only tool whose server process dies mid-call."""
    os._exit(3)


@server.tool()
def die_after_sending(to: str) -> str:
    """An unguarded tool whose server dies after its effect happened, before it answers."""
    _record(f"die_after_sending {to}")
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def hang_reading() -> str:
    """A read-only tool that never answers."""
    time.sleep(3600)
    return "never"


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
def hang_setting(name: str) -> str:
    """An idempotent tool that never answers."""
    _record(f"hang_setting {name}")
    time.sleep(3600)
    return "never"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def garbage_reading() -> str:
    """A read-only tool that writes garbage where the protocol's answer should be, then stops."""
    sys.stdout.write("this is not JSON-RPC {{{\n")
    sys.stdout.flush()
    time.sleep(3600)
    return "never"


@server.tool()
def garbage_sending(to: str) -> str:
    """An unguarded tool that sends, then writes garbage instead of its answer."""
    _record(f"garbage_sending {to}")
    sys.stdout.write("\x00\x01 garbage \n")
    sys.stdout.flush()
    time.sleep(3600)
    return "never"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo_effect_key(ctx: Context) -> str:
    """Answer with the effect key the client sent in the request's _meta."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("io.threads-celery/effect-key", "none"))


@server.tool()
def slow_once(ref: str) -> str:
    """Record an effect; the first time for a ref, stay busy until the calling process dies.

    The ledger line names the calling process (this server's parent), so a chaos test can
    SIGKILL the worker process that is in the middle of the call.
    """
    ledger = os.environ.get("MCP_TEST_LEDGER", "")
    earlier = 0
    if ledger and os.path.exists(ledger):
        with open(ledger, encoding="utf-8") as f:
            earlier = sum(1 for line in f if line.startswith(f"slow_once {ref} "))
    parent = os.getppid()
    _record(f"slow_once {ref} caller={parent}")
    if earlier == 0:
        deadline = time.monotonic() + 120
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)  # the caller is gone: nobody is left to answer
    return f"done {ref}"


if os.environ.get("MCP_TEST_EXTRA_TOOL") == "1":

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def extra_lookup(key: str) -> str:
        """A tool that only some versions of the server have."""
        return key


def main(argv: list[str]) -> None:
    transport = argv[1] if len(argv) > 1 else "stdio"
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(argv[2]))
    else:
        raise SystemExit(f"unknown transport {transport!r}: use stdio or http PORT")


if __name__ == "__main__":
    main(sys.argv)
