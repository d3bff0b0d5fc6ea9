"""``run_code`` and ``ctx.run_code``: code in a fresh, limited subprocess that never sees the worker.

Each test runs a real interpreter (Python always; Node.js where installed, or a stand-in script
when the test is about how Node is invoked). Limits are kept small (1 s, 128 MB) so the module
stays fast; nothing asserts on timing beyond the call returning with the right flags.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.waiting import eventually
from threads_celery import Agent, Settings, Threads, tool
from threads_celery.definitions.context import ToolContext
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.workspace import sandbox
from threads_celery.workspace.sandbox import NODE_MISSING, CodeResult, run_code

WAIT_S = 30.0
_names = itertools.count()
REAL_NODE = shutil.which("node")


# -- plain runs ---------------------------------------------------------------------------------


def test_hello_world() -> None:
    result = run_code("print('hello, world')")
    assert result == CodeResult(ok=True, exit_code=0, stdout="hello, world\n", stderr="")


def test_stdin_reaches_the_code() -> None:
    result = run_code("import sys; print(sys.stdin.read().upper())", stdin="shout\n")
    assert result.ok
    assert result.stdout == "SHOUT\n\n"


def test_an_exception_is_a_failed_result_with_its_traceback() -> None:
    result = run_code("def f():\n    return 1 / 0\nf()\n")
    assert result.ok is False
    assert result.exit_code == 1
    assert result.killed is False and result.timed_out is False
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    assert result.error == "exited with status 1: ZeroDivisionError: division by zero"


def test_a_syntax_error_is_a_failed_result() -> None:
    result = run_code("def (:")
    assert result.ok is False
    assert "SyntaxError" in result.stderr


def test_an_infinite_loop_times_out() -> None:
    result = run_code("while True:\n    pass\n", timeout_s=1.0)
    assert result.ok is False
    assert result.timed_out is True
    assert result.killed is True
    assert result.error == "timed out after 1s"


def test_code_that_closes_its_output_still_times_out() -> None:
    # With both pipes at EOF the supervisor must keep watching the clock, not stop reading.
    result = run_code("import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass\n", timeout_s=1.0)
    assert result.timed_out is True


def test_allocating_past_the_memory_cap_fails() -> None:
    result = run_code("b = bytearray(600 * 2**20)\nprint('allocated')", memory_mb=128)
    assert result.ok is False
    assert "allocated" not in result.stdout
    assert "MemoryError" in result.stderr or result.killed


def test_allocating_under_the_memory_cap_works() -> None:
    result = run_code("b = bytearray(16 * 2**20)\nprint(len(b))", memory_mb=128)
    assert result.ok, result
    assert result.stdout == f"{16 * 2**20}\n"


def test_output_is_capped_with_a_note() -> None:
    result = run_code(
        "import sys\nsys.stdout.write('x' * 50_000)\nsys.stderr.write('y' * 50_000)", max_output_bytes=1000
    )
    assert result.ok
    assert result.stdout.startswith("x" * 1000 + "\n[output truncated: 50000 bytes written, the first 1000 kept]")
    assert result.stderr.startswith("y" * 1000 + "\n[output truncated")


def test_unknown_language_is_a_clear_error_not_an_exception() -> None:
    result = run_code("puts 1", "ruby")
    assert result.ok is False
    assert result.exit_code is None
    assert result.error == "unsupported language 'ruby'; supported: javascript, python"


def test_non_positive_limits_are_a_caller_mistake() -> None:
    with pytest.raises(ValueError):
        run_code("print(1)", timeout_s=0)
    with pytest.raises(ValueError):
        run_code("print(1)", memory_mb=-1)


# -- isolation -----------------------------------------------------------------------------------


def test_the_code_sees_none_of_the_workers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_SECRET_KEY", "canary-123")
    monkeypatch.setenv("THREADS_DATABASE_URL", "postgresql://user:canary-456@db/threads")
    monkeypatch.setenv("DATABASE_URL", "postgresql://user:canary-789@db/app")
    code = "import json, os\nprint(json.dumps(dict(os.environ)))\nprint(open('/proc/self/environ', 'rb').read())"
    result = run_code(code)
    assert result.ok, result
    env = json.loads(result.stdout.splitlines()[0])
    assert not [name for name in env if name.startswith("THREADS_")]
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD"}  # bubblewrap sets PWD after its chdir
    assert "canary" not in result.stdout


def test_the_code_inherits_no_open_file_descriptor(tmp_path: Path) -> None:
    with open(tmp_path / "secret.txt", "w") as f:
        os.set_inheritable(f.fileno(), True)  # even a descriptor marked inheritable stays behind
        code = f"import os\ntry:\n    os.fstat({f.fileno()})\n    print('open')\nexcept OSError:\n    print('closed')\n"
        result = run_code(code)
    assert result.stdout == "closed\n"


def test_unsandboxed_code_runs_in_its_own_directory_which_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    removed: list[Path] = []
    remove = sandbox._remove_tree
    monkeypatch.setattr(sandbox, "_remove_tree", lambda path: (removed.append(path), remove(path)))
    code = "import os\nopen('left-behind.txt', 'w').write('x')\nos.mkdir('sub')\nos.chmod('sub', 0)\nprint(os.getcwd())"
    result = run_code(code, unsandboxed=True)
    assert result.ok, result
    [workdir] = removed
    assert result.stdout.strip() == str(workdir)
    assert workdir != Path.cwd()
    assert workdir.name.startswith("threads-code-")
    assert not workdir.exists()


def test_sandboxed_code_runs_in_scratch_space_of_its_own_and_no_host_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    code = "import os\nopen('left-behind.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))"
    result = run_code(code)
    assert result.ok, result
    assert result.stdout.strip() == "/sandbox ['left-behind.txt', 'main.py']"  # the tmpfs, as the sandbox shows it
    assert made == []  # nothing on the host's disk to leave behind


def test_the_code_cannot_import_the_workers_packages() -> None:
    # -I -S: no site-packages, so the worker's libraries (and their configuration) are not there.
    result = run_code("import threads_celery")
    assert result.ok is False
    assert "ModuleNotFoundError" in result.stderr


def _process_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status  # killed; waiting for a parent that may never reap it


def _processes_with(marker: str) -> list[int]:
    """Host pids of live processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and not _process_gone(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("unsandboxed", [False, True], ids=["sandboxed", "unsandboxed"])
def test_processes_the_code_leaves_behind_are_killed(unsandboxed: bool) -> None:
    marker = f"left-behind-{os.getpid()}-{next(_names)}"
    code = (
        f"import subprocess, time\np = subprocess.Popen(['{marker}', '60'], executable='/bin/sleep')\n"
        "time.sleep(0.2)\nprint(p.poll())"
    )
    result = run_code(code, timeout_s=5.0, unsandboxed=unsandboxed)
    assert result.ok, result
    assert result.stdout == "None\n"  # still running when the code ended
    eventually(
        lambda: not _processes_with(marker),
        timeout=5,
        what="the child process gone",
        detail=lambda: _processes_with(marker),
    )


def test_limits_cap_memory_per_interpreter_and_processes_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    python = {name: (soft, hard) for name, soft, hard in sandbox._limits("python", 1.0, 128)}
    node = {name: (soft, hard) for name, soft, hard in sandbox._limits("javascript", 1.0, 128)}
    assert python["RLIMIT_AS"] == (128 * 2**20, 128 * 2**20)
    assert "RLIMIT_AS" not in node  # V8 reserves more address space than it uses
    assert node["RLIMIT_DATA"] == (128 * 2**20, 128 * 2**20)
    assert python["RLIMIT_CPU"] == (2, 3)
    assert python["RLIMIT_CORE"] == (0, 0)
    # RLIMIT_NPROC counts the user's threads: as a user that runs nothing, only the allowance.
    monkeypatch.setattr(sandbox.os, "getuid", lambda: 2**31 - 7)
    as_user = {name: (soft, hard) for name, soft, hard in sandbox._limits("python", 1.0, 128)}
    if Path("/proc/self/task").is_dir():
        assert as_user["RLIMIT_NPROC"] == (sandbox.EXTRA_PROCESSES, sandbox.EXTRA_PROCESSES)


# -- cancellation ---------------------------------------------------------------------------------


def test_cancel_returning_true_stops_the_code() -> None:
    polls = itertools.count()

    def cancel() -> bool:
        return next(polls) >= 3  # a few polls in, once the code is surely running

    result = run_code("while True:\n    pass\n", timeout_s=60.0, cancel=cancel)
    assert result.cancelled is True
    assert result.killed is True
    assert result.timed_out is False
    assert result.ok is False
    assert result.error == "cancelled by the caller"


def test_a_failing_cancel_check_does_not_stop_the_code() -> None:
    def cancel() -> bool:
        raise RuntimeError("store unreachable")

    result = run_code("import time\ntime.sleep(0.3)\nprint('finished')", cancel=cancel)
    assert result.ok
    assert result.stdout == "finished\n"


# -- JavaScript ------------------------------------------------------------------------------------


def test_javascript_without_node_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    result = run_code("console.log(1 + 1)", "javascript")
    assert result == CodeResult(ok=False, exit_code=None, stdout="", stderr="", error=NODE_MISSING)
    assert NODE_MISSING == "JavaScript needs Node.js, which is not installed"


def test_javascript_is_handed_to_node_as_a_file_with_a_heap_cap(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # A stand-in for node that shows how it was called, so this runs where node is absent too.
    # In a directory the sandbox's unprivileged user can reach (pytest's tmp_path is private to root).
    fake_home = Path(tempfile.mkdtemp(prefix="threads-fake-node-"))
    request.addfinalizer(lambda: shutil.rmtree(fake_home, ignore_errors=True))
    fake_home.chmod(0o755)
    (fake_home / "bin").mkdir(mode=0o755)
    fake_node = fake_home / "bin" / "node"
    fake_node.write_text('#!/bin/sh\necho "args: $1 $2"\ncat "$2"\n')
    fake_node.chmod(0o755)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: str(fake_node) if name == "node" else None)
    result = run_code("console.log(1 + 1)", "js", memory_mb=96)
    assert result.ok, result
    assert result.stdout == "args: --max-old-space-size=96 main.js\nconsole.log(1 + 1)"


@pytest.mark.skipif(REAL_NODE is None, reason="Node.js is not installed")
def test_javascript_runs_under_node() -> None:
    result = run_code("console.log(1 + 1)", "javascript")
    assert result.ok, result
    assert result.stdout == "2\n"


@pytest.mark.skipif(REAL_NODE is None, reason="Node.js is not installed")
def test_javascript_past_the_memory_cap_fails() -> None:
    result = run_code("const b = Buffer.alloc(600 * 2**20); console.log(b.length)", "javascript", memory_mb=128)
    assert result.ok is False
    assert str(600 * 2**20) not in result.stdout


# -- ctx.run_code inside a run ---------------------------------------------------------------------


def test_ctx_run_code_uses_the_settings_defaults_and_the_cancel_flag() -> None:
    ctx = ToolContext(
        effect_key="k",
        run_id="r",
        thread_id="t",
        attempt=1,
        is_cancelled=lambda: True,
        settings=Settings(code_timeout_s=60.0, code_max_output_bytes=10),
    )
    stopped = ctx.run_code("while True:\n    pass\n")
    assert stopped.cancelled is True
    free = ToolContext(
        effect_key="k", run_id="r", thread_id="t", attempt=1, settings=Settings(code_max_output_bytes=10)
    )
    capped = free.run_code("print('0123456789abcdef')")
    assert capped.stdout.startswith("0123456789\n[output truncated")


class Code(BaseModel):
    code: str


class SeenByModel:
    """A script entry that records the tool results the model was shown, then answers."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.results: list[str] = []

    def __call__(self, messages: list[Any]) -> str:
        from pydantic_ai.messages import ModelRequest, ToolReturnPart

        self.results = [
            str(part.content)
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        return self.answer


def test_a_tool_runs_code_and_the_result_reaches_the_model(threads: Threads) -> None:
    run_python = tool(
        name="run_python",
        description="Run Python code and see its output.",
        input=Code,
        effect="read_only",
        execute=lambda inp, ctx: ctx.run_code(inp.code, timeout_s=5.0),
    )
    seen = SeenByModel("It printed 42.")
    agent = Agent(
        name=f"coder_{next(_names)}",
        instructions="Run code.",
        model=ScriptedModel([call("run_python", code="print(6 * 7)"), seen]),
        tools=[run_python],
    )
    handle = threads.start(agent, "what is 6 * 7?")
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    assert run.status == "completed"
    assert run.output == "It printed 42."
    assert len(seen.results) == 1
    shown = json.loads(seen.results[0])
    assert shown["ok"] is True
    assert shown["stdout"] == "42\n"
    result = threads.messages(handle.thread_id)[2].tool_result
    assert result is not None and result.is_error is False


def test_cancelling_the_run_stops_the_code_its_tool_runs(threads: Threads) -> None:
    started = threading.Event()
    outcomes: list[CodeResult] = []

    def spin(inp: Code, ctx: Any) -> CodeResult:
        started.set()
        outcome = ctx.run_code(inp.code, timeout_s=WAIT_S * 2)
        outcomes.append(outcome)
        return outcome

    agent = Agent(
        name=f"spinner_{next(_names)}",
        instructions="Spin.",
        model=ScriptedModel([call("spin", code="while True:\n    pass\n"), say("done")]),
        tools=[tool(name="spin", description="Spin.", input=Code, effect="read_only", execute=spin)],
    )
    handle = threads.start(agent, "spin")
    assert started.wait(WAIT_S), "the tool never started"
    threads.cancel(handle.run_id)
    eventually(lambda: outcomes, timeout=WAIT_S, what="the code stopping")
    assert outcomes[0].cancelled is True
    assert outcomes[0].timed_out is False
    assert threads.get_run(handle.run_id).status == "aborted"
