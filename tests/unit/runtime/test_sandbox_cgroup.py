"""Each sandboxed ``run_code`` call is capped as a whole by a cgroup of its own.

Per-process rlimits alone let ten processes hold 220 MiB each under ``memory_mb=256`` and a call
start 62 processes; the call's cgroup caps memory and tasks across all of them, and is gone when
the call ends. These run the real bubblewrap in a real cgroup (v2 or v1) and skip, failing under
``CI=true``, where there is none.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from threads_celery.workspace import cgroups, isolation, sandbox
from threads_celery.workspace.sandbox import run_code

if isolation.find_bwrap() is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("bubblewrap (bwrap) is not installed; .ci/run installs it")
    pytest.skip("bubblewrap (bwrap) is not installed", allow_module_level=True)
try:
    cgroups.find_parent("auto")
except cgroups.CgroupUnavailable as exc:
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"no usable cgroup for run_code: {exc}") from None
    pytest.skip(f"no usable cgroup here: {exc}", allow_module_level=True)

# Ten children each take 220 MiB (every byte written) and report; the parent counts how many
# hold theirs at the same moment (a reporter sleeps until killed, so all counted hold at once).
HOG = """
import os, select, signal, time
N = 10
r, w = os.pipe()
children = []
for _ in range(N):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        block = bytearray(b"\\x01") * (220 * 2**20)
        os.write(w, b"1")
        time.sleep(60)
        os._exit(0)
    children.append(pid)
os.close(w)
held, alive, deadline = 0, set(children), time.monotonic() + 20
while held < N and alive and time.monotonic() < deadline:
    if select.select([r], [], [], 0.1)[0]:
        held += len(os.read(r, 64))
    for pid in list(alive):
        if os.waitpid(pid, os.WNOHANG)[0]:
            alive.discard(pid)
print(f"held {held} of {N} at once", flush=True)
for pid in alive:
    os.kill(pid, signal.SIGKILL)
"""

FORKS = """
import os, time
started = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    started += 1
print(f"started {started}", flush=True)
"""


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[cgroups.CallCgroup]:
    """Every call cgroup ``run_code`` creates during the test."""
    calls: list[cgroups.CallCgroup] = []
    create = cgroups.Parent.create

    def recording(self: cgroups.Parent, memory_bytes: int, max_tasks: int) -> cgroups.CallCgroup:
        call = create(self, memory_bytes, max_tasks)
        calls.append(call)
        return call

    monkeypatch.setattr(cgroups.Parent, "create", recording)
    return calls


def test_ten_processes_cannot_hold_more_than_the_calls_memory_together() -> None:
    result = run_code(HOG, memory_mb=256, timeout_s=30)
    assert "held 10 of 10 at once" not in result.stdout, result
    assert not result.ok
    assert result.error is not None and result.error.startswith("memory cap hit"), result
    assert "256 MiB" in result.error


def test_the_call_cannot_start_more_tasks_than_its_cap() -> None:
    result = run_code(FORKS, timeout_s=20)
    started = int(result.stdout.split()[-1])
    # bubblewrap's two processes and the interpreter count too: the call as a whole is capped.
    assert 0 < started <= sandbox.MAX_TASKS - 3, result


def test_the_sandbox_runs_in_the_calls_cgroup_and_it_is_gone_after_the_call(made: list[cgroups.CallCgroup]) -> None:
    code = "import os, time\nfor _ in range(5):\n    os.fork() == 0 and time.sleep(60)\nprint('ok', flush=True)\n"
    result = run_code(code, timeout_s=20)
    assert result.ok and "ok" in result.stdout, result
    assert len(made) == 1 and made[0].dirs
    assert all(d.name.startswith(cgroups.PREFIX) for d in made[0].dirs)
    assert not any(d.exists() for d in made[0].dirs)  # its sleeping children were killed with it


def test_the_calls_cgroup_is_gone_after_a_timeout_kill(made: list[cgroups.CallCgroup]) -> None:
    code = "import os, time\nos.setsid() if os.fork() == 0 else None\ntime.sleep(60)\n"
    result = run_code(code, timeout_s=1)
    assert result.timed_out, result
    assert len(made) == 1
    assert not any(d.exists() for d in made[0].dirs)


@pytest.mark.parametrize("where", ["/nonexistent/threads-cgroup", "/proc/self", "/"])
def test_an_unusable_cgroup_setting_refuses_with_one_clear_error(
    where: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setenv(cgroups.SETTING, where)
    result = run_code(f"open({str(marker)!r}, 'w').write('x')")
    assert not result.ok and result.exit_code is None, result
    assert result.error is not None and "\n" not in result.error
    assert cgroups.SETTING in result.error and where in result.error
    assert "cannot cap memory and processes" in result.error
    assert not marker.exists()


def test_an_unknown_setting_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cgroups.SETTING, "v3")
    result = run_code("print(1)")
    assert result.exit_code is None and result.error is not None and cgroups.SETTING in result.error


def test_asking_for_the_version_the_host_lacks_refuses_naming_it() -> None:
    missing = "v1" if cgroups.find_parent("auto").version == 2 else "v2"
    result = run_code("print(1)", cgroup=missing)
    assert result.exit_code is None and result.error is not None
    assert "cannot cap memory and processes" in result.error and "docs/workspace.md" in result.error


def test_unsandboxed_code_keeps_running_without_a_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cgroups.SETTING, "/nonexistent/threads-cgroup")
    assert run_code("print(1)", unsandboxed=True).ok
