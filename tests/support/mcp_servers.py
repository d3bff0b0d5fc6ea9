"""Start the test MCP server (tests/support/mcp_test_server.py) the way the tests need it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from threads_celery import MCPServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULE = "tests.support.mcp_test_server"


def stdio_server(
    ledger: Path | None = None, *, extra_tool: bool = False, **options: Any
) -> MCPServer:
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_server_process(ledger: Path | None = None, *, timeout: float = 30.0) -> Iterator[str]:
    """The test server over streamable HTTP on a free port; yields its URL, stops it afterwards."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if ledger is not None:
        env["MCP_TEST_LEDGER"] = str(ledger)
    proc = subprocess.Popen(
        [sys.executable, "-m", SERVER_MODULE, "http", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"the MCP test server exited with {proc.returncode} before listening"
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the MCP test server did not listen on {port} within {timeout:g}s"
                    ) from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server process started here (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def ledger_lines(ledger: Path) -> list[str]:
    """The effects the test server recorded, one line each."""
    return ledger.read_text().splitlines() if ledger.exists() else []
