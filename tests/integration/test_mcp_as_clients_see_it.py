"""MCP tools behave as the server's own clients see them, on the embedded runtime.

Against the SDK-written test server (tests/support/mcp_test_server.py) over stdio:
- hooks, approvals and a hook's ``Modify`` see and edit the model's own arguments, and a
  ``Modify`` is validated against the server's schema; an approved call on an agent with hooks
  reaches the server;
- a JSON-RPC error answer is a tool error the model sees, never a park;
- ``destructiveHint`` asks first under ``accept_edits``;
- ``connect_timeout_s`` bounds everything before the call is sent, the SDK's protocol probe
  included;
- a process keeps one session per server, and starts it again when it died.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_servers import SERVER_MODULE, ledger_lines, stdio_server
from tests.support.processes import REPO_ROOT
from tests.support.waiting import eventually
from threads_celery import Agent, MCPServer, Settings, Threads
from threads_celery.decisions.permissions import Permissions
from threads_celery.definitions.hooks import Allow, HookCall, HookContext, HookResult, Modify
from threads_celery.definitions.mcp_servers import MCPUnreachable
from threads_celery.records import Message
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 60.0
_names = itertools.count()


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    with Threads.embedded(settings=Settings(model_retries=0)) as runtime:
        yield runtime


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


def results(threads: Threads, thread_id: str) -> list[Message]:
    return [m for m in threads.messages(thread_id) if m.role == "tool"]


class Editing(Agent):
    """Records what ``before_tool`` and ``after_tool`` see; changes ``send_note``'s text when asked."""

    seen: list[dict[str, Any]]
    edit: dict[str, Any] | None = None

    def before_tool(self, call: HookCall, ctx: HookContext) -> Allow | Modify:
        self.seen.append({"before": dict(call.args)})
        return Modify(self.edit) if self.edit is not None else Allow()

    def after_tool(self, call: HookCall, result: HookResult, ctx: HookContext) -> None:
        self.seen.append({"after": dict(call.args)})


def editing_agent(server: MCPServer, *replies: object, edit: dict[str, Any] | None = None, **options: Any) -> Editing:
    agent = Editing(
        f"mcp_hooked_{next(_names)}",
        "Use the tools.",
        ScriptedModel(list(replies)),  # type: ignore[arg-type]
        mcp_servers=[server],
        **options,
    )
    agent.seen, agent.edit = [], edit
    return agent


def test_hooks_see_and_edit_the_models_own_arguments(threads: Threads, ledger: Path) -> None:
    agent = editing_agent(
        stdio_server(ledger),
        call("send_note", to="ann", text="raw"),
        say("sent"),
        edit={"to": "ann", "text": "edited"},
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "Tell Ann")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert agent.seen == [
        {"before": {"to": "ann", "text": "raw"}},
        {"after": {"to": "ann", "text": "edited"}},
    ]
    assert ledger_lines(ledger) == ["send_note ann: edited"]  # the server got the edit


def test_a_modify_that_fails_the_servers_schema_is_refused(threads: Threads, ledger: Path) -> None:
    agent = editing_agent(
        stdio_server(ledger),
        call("send_note", to="ann", text="raw"),
        say("gave up"),
        edit={"to": "ann"},  # "text" is required by the server's schema
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(agent, "Tell Ann")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [result] = results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.is_error
    assert "changed the arguments to ones that fail validation" in result.tool_result.content
    assert "'text' is a required property" in result.tool_result.content
    assert ledger_lines(ledger) == []


def test_an_approved_call_on_an_agent_with_hooks_reaches_the_server(threads: Threads, ledger: Path) -> None:
    agent = editing_agent(stdio_server(ledger), call("send_note", to="bo", text="hello"), say("sent"))
    handle = threads.start(agent, "Tell Bo")
    assert threads.wait(handle.run_id, WAIT_S).status == "awaiting_approval"
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert json.loads(pending.args) == {"to": "bo", "text": "hello"}  # the person sees what the model sent
    threads.approve(pending.effect_key, principal="tester", override_args={"to": "bo", "text": "hello, edited"})
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    assert ledger_lines(ledger) == ["send_note bo: hello, edited"]
    [result] = results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.content == "sent to bo"


def test_a_json_rpc_error_answer_is_a_tool_error_not_a_park(threads: Threads, ledger: Path) -> None:
    agent = Agent(
        f"mcp_refused_{next(_names)}",
        "Use the tools.",
        ScriptedModel([call("refuse_params", to="nobody"), say("it refused")]),
        mcp_servers=[stdio_server(ledger)],
        permissions=Permissions.allow_all(),
    )
    assert next(t for t in agent.tools if t.name == "refuse_params").effect == "unguarded"
    handle = threads.start(agent, "Send it")
    run = threads.wait(handle.run_id, WAIT_S)
    assert (run.status, run.output) == ("completed", "it refused"), run.error
    [result] = results(threads, handle.thread_id)
    assert result.tool_result is not None and result.tool_result.is_error
    assert "refused the call" in result.tool_result.content and "-32602" in result.tool_result.content
    assert [p for p in threads.parked() if p.run_id == handle.run_id] == []


def test_a_destructive_tool_asks_first_under_accept_edits(threads: Threads, ledger: Path) -> None:
    server = stdio_server(ledger)
    by_name = {t.name: t for t in server.tools()}
    assert (by_name["reset_flags"].effect, by_name["reset_flags"].destructive) == ("idempotent", True)
    assert (by_name["set_flag"].effect, by_name["set_flag"].destructive) == ("idempotent", False)
    assert by_name["send_note"].destructive and not by_name["lookup_city"].destructive  # MCP's defaults
    agent = Agent(
        f"mcp_edits_{next(_names)}",
        "Use the tools.",
        ScriptedModel([call("set_flag", name="x", value=True), call("reset_flags", scope="all"), say("done")]),
        mcp_servers=[server],
        permissions=Permissions("accept_edits"),
    )
    handle = threads.start(agent, "Reset")
    assert threads.wait(handle.run_id, WAIT_S).status == "awaiting_approval"
    assert ledger_lines(ledger) == ["set_flag x=True"]  # the edit ran; the destructive call waits
    [pending] = [p for p in threads.parked() if p.run_id == handle.run_id]
    assert pending.tool == "reset_flags" and "destructive" in pending.reason
    threads.approve(pending.effect_key, principal="tester")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert ledger_lines(ledger) == ["set_flag x=True", "reset_flags all"]


def test_connect_timeout_bounds_everything_before_the_call_is_sent(tmp_path: Path) -> None:
    hang = tmp_path / "hang"  # once it exists, the "server" never answers a byte

    def sometimes_silent(connect_timeout_s: float) -> MCPServer:
        return MCPServer(
            "sometimes-silent",
            command="sh",
            args=[
                "-c",
                f'if [ -e "{hang}" ]; then exec sleep 60; fi; exec "{sys.executable}" -m {SERVER_MODULE} stdio',
            ],
            env={"PYTHONPATH": str(REPO_ROOT)},
            cwd=str(REPO_ROOT),
            dedup_window_ms=60_000,
            connect_timeout_s=connect_timeout_s,
        )

    assert "lookup_city" in [t.name for t in sometimes_silent(30).tools()]  # it answers, until...
    hang.touch()
    server = sometimes_silent(1)
    outcome: dict[str, BaseException | str] = {}

    def call_it() -> None:
        try:
            outcome["value"] = asyncio.run(server.call("lookup_city", {"city": "Metz"}))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    caller = threading.Thread(target=call_it, daemon=True)
    caller.start()
    # The SDK alone would wait out its 10 s protocol probe, then the handshake's own timeout.
    caller.join(8.0)
    assert not caller.is_alive(), "the call was not bounded by connect_timeout_s"
    error = outcome.get("error")
    assert isinstance(error, MCPUnreachable) and "did not answer within 1 s" in str(error), outcome


def test_one_session_per_server_started_again_when_it_died(threads: Threads, ledger: Path) -> None:
    server = stdio_server(ledger)
    agent = Agent(
        f"mcp_session_{next(_names)}",
        "Use the tools.",
        ScriptedModel([call("server_pid"), call("server_pid"), call("die_reading"), call("server_pid"), say("done")]),
        mcp_servers=[server],
    )
    handle = threads.start(agent, "Which process?")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    first, second, died, third = [m.tool_result for m in results(threads, handle.thread_id)]
    assert first is not None and second is not None and died is not None and third is not None
    assert first.content == second.content  # the same server process answered both
    assert died.is_error and "read_only" not in died.content
    assert third.content.isdigit() and third.content != first.content  # a new server after it died


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_server_that_died_while_idle_is_started_again_before_the_call_is_sent(threads: Threads, ledger: Path) -> None:
    server = stdio_server(ledger)
    first = Agent(
        f"mcp_idle_{next(_names)}",
        "Use the tools.",
        ScriptedModel([call("server_pid"), say("done")]),
        mcp_servers=[server],
    )
    handle = threads.start(first, "Which process?")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    [answered] = results(threads, handle.thread_id)
    assert answered.tool_result is not None
    pid = int(answered.tool_result.content)
    os.kill(pid, signal.SIGKILL)  # the session is idle: no call in flight
    eventually(lambda: _gone(pid), timeout=WAIT_S, what="the killed server process gone")
    second = Agent(
        f"mcp_idle_{next(_names)}",
        "Use the tools.",
        ScriptedModel([call("send_note", to="cy", text="still here"), say("sent")]),
        mcp_servers=[server],
        permissions=Permissions.allow_all(),
    )
    handle = threads.start(second, "Tell Cy")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error  # an unguarded call on a dead session would park
    assert ledger_lines(ledger) == ["send_note cy: still here"]
