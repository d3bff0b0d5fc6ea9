"""Start the test MCP server (tests/support/mcp_test_server.py) the way the tests need it."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.processes import REPO_ROOT, ManagedProcess, free_port
from tests.support.waiting import eventually
from threads_celery import MCPServer

SERVER_MODULE = "tests.support.mcp_test_server"


def stdio_server(ledger: Path | None = None, *, extra_tool: bool = False, **options: Any) -> MCPServer:
    """An MCPServer that starts the test server over stdio for each call."""
    env = {"PYTHONPATH": str(REPO_ROOT)}
    if ledger is not None:
        env["MCP_TEST_LEDGER"] = str(ledger)
    if extra_tool:
        env["MCP_TEST_EXTRA_TOOL"] = "1"
    options.setdefault("dedup_window_ms", 60_000)
    return MCPServer(
        options.pop("name", "test-stdio"),
        command=sys.executable,
        args=["-m", SERVER_MODULE, "stdio"],
        env=env,
        cwd=str(REPO_ROOT),
        **options,
    )


@contextmanager
def http_server_process(ledger: Path | None = None, *, timeout: float = 30.0) -> Iterator[str]:
    """The test server over streamable HTTP on a free port; yields its URL, stops it afterwards."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if ledger is not None:
        env["MCP_TEST_LEDGER"] = str(ledger)
    argv = [sys.executable, "-m", SERVER_MODULE, "http", str(port)]
    with tempfile.TemporaryDirectory(prefix="mcp-test-server-") as logs:
        server = ManagedProcess("the MCP test server", argv, env=env, log_path=Path(logs) / "server.log").start()
        try:
            eventually(
                lambda: _listening(server, port),
                timeout=timeout,
                what=f"the MCP test server listening on {port}",
                detail=server.log_tail,
            )
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            server.terminate(timeout=10)


def _listening(server: ManagedProcess, port: int) -> bool:
    if not server.alive():
        raise AssertionError(f"{server.name} exited before listening:\n{server.log_tail()}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def ledger_lines(ledger: Path) -> list[str]:
    """The effects the test server recorded, one line each."""
    return ledger.read_text().splitlines() if ledger.exists() else []
