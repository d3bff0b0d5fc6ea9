"""The official ``mcp-server-time`` from the package registry, unchanged, as an agent's MCP server.

Installed into the session's own folder (``pip install --target``, without its dependencies: it
needs the MCP SDK this project already has, pydantic and tzlocal) and started over stdio by
``MCPServer``. Its annotations make both tools read_only; a call answers with the server's JSON,
and a call the server refuses (an unknown time zone) is a tool error the model sees, while the
run goes on. Skipped when the registry cannot be reached, failed under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from threads_celery import Agent, MCPServer, Settings, Threads
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 60.0


@pytest.fixture(scope="module")
def time_server(tmp_path_factory: pytest.TempPathFactory) -> MCPServer:
    target = tmp_path_factory.mktemp("mcp-server-time")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--target", str(target), "mcp-server-time", "tzdata"],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"mcp-server-time could not be installed: {exc}")
        pytest.skip(f"mcp-server-time could not be installed: {exc}")
    return MCPServer(
        "time",
        command=sys.executable,
        args=["-m", "mcp_server_time", "--local-timezone", "UTC"],
        env={"PYTHONPATH": str(target)},
        connect_timeout_s=30,
    )


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded(settings=Settings(model_retries=0)) as runtime:
        yield runtime


def test_the_official_time_server_answers_and_refuses_as_its_clients_see_it(
    threads: Threads, time_server: MCPServer
) -> None:
    assert {t.name: (t.effect, t.destructive) for t in time_server.tools()} == {
        "get_current_time": ("read_only", False),
        "convert_time": ("read_only", False),
    }
    agent = Agent(
        "official_time",
        "Tell the time.",
        ScriptedModel(
            [
                call("get_current_time", timezone="Europe/Paris"),
                call("convert_time", source_timezone="Nowhere/Land", time="16:30", target_timezone="Asia/Tokyo"),
                call("get_current_time", timezone="Asia/Tokyo"),
                say("done"),
            ]
        ),
        mcp_servers=[time_server],
    )
    run = threads.wait(threads.start(agent, "What time is it?").run_id, WAIT_S)
    assert run.status == "completed", run.error
    paris, refused, tokyo = [m.tool_result for m in threads.messages(run.thread_id) if m.tool_result is not None]
    assert paris is not None and not paris.is_error and json.loads(paris.content)["timezone"] == "Europe/Paris"
    assert refused is not None and refused.is_error and "Nowhere/Land" in refused.content
    assert tokyo is not None and json.loads(tokyo.content)["timezone"] == "Asia/Tokyo"
    assert time_server.env is not None and Path(time_server.env["PYTHONPATH"]).is_dir()  # installed apart
