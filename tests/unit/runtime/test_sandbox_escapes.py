"""Each way out of ``run_code`` that the old subprocess left open now fails, as root too.

The code under test is hostile: it looks for the worker's secrets in ``/proc``, connects to the
services on loopback, reads another thread's files and the project checkout, leaves a
double-forked ``setsid()`` child behind, forks without end, and writes over the system. Each
attempt must end in a clear error inside the sandbox, with the worker unharmed. These tests run
the real bubblewrap; they skip (and fail under ``CI=true``) where it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT
from tests.support.waiting import eventually
from threads_celery.workspace import isolation, sandbox
from threads_celery.workspace.sandbox import run_code

if isolation.find_bwrap() is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("bubblewrap (bwrap) is not installed; .ci/run installs it")
    pytest.skip("bubblewrap (bwrap) is not installed", allow_module_level=True)


def run(code: str, **options: object) -> dict[str, object]:
    """Run ``code`` (which prints one JSON object last) and return that object."""
    result = run_code(code, timeout_s=20.0, **options)  # type: ignore[arg-type]
    assert result.ok, result
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_code_sees_none_of_the_workers_processes_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = f"canary-{os.getpid()}-secret-key"
    monkeypatch.setenv("THREADS_SECRET_KEY", canary)
    monkeypatch.setenv("THREADS_API_TOKENS", canary)
    code = f"""
import json, os
seen, leaks, errors = [], [], []
for pid in [os.getppid(), {os.getpid()}, 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    for name in ('environ', 'cmdline'):
        try:
            data = open(f'/proc/{{pid}}/{{name}}', 'rb').read()
            seen.append(pid)
            if b'canary' in data:
                leaks.append(pid)
        except OSError as exc:
            errors.append(type(exc).__name__)
print(json.dumps({{"pids": sorted(set(int(p) for p in os.listdir('/proc') if p.isdigit())), "leaks": leaks,
                   "worker_visible": os.path.exists('/proc/{os.getpid()}'), "errors": sorted(set(errors))}}))
"""
    found = run(code)
    assert found["leaks"] == []
    assert found["worker_visible"] is False
    assert len(found["pids"]) <= 3  # bubblewrap's init, the code, nothing of the host  # type: ignore[arg-type]


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on loopback standing in for Redis/PostgreSQL (the real ones are probed too)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1])
    server.close()
    for conn in accepted:
        conn.close()


CONNECT = """
import json, socket, os
out = {{}}
for port in ({ports}):
    try:
        socket.create_connection(('127.0.0.1', port), timeout=2).close()
        out[str(port)] = 'connected'
    except OSError as exc:
        out[str(port)] = type(exc).__name__
out['pg_socket'] = os.path.exists('/var/run/postgresql') or os.path.exists('/run/postgresql')
print(json.dumps(out))
"""


def test_the_code_reaches_no_service_of_the_host(listener: int) -> None:
    found = run(CONNECT.format(ports=f"{listener}, 6379, 5432, 5672"))
    assert found == {str(listener): "ConnectionRefusedError", "6379": "ConnectionRefusedError",
                     "5432": "ConnectionRefusedError", "5672": "ConnectionRefusedError", "pg_socket": False}  # fmt: skip


def test_network_is_there_only_when_the_call_asks_for_it(listener: int) -> None:
    assert run(CONNECT.format(ports=f"{listener},"), network=True)[str(listener)] == "connected"


def test_the_code_cannot_read_another_threads_files_the_project_or_home() -> None:
    # World-readable on purpose: what stops the code is the sandbox, not file permissions.
    files_root = Path(tempfile.mkdtemp(prefix="threads-files-"))
    try:
        files_root.chmod(0o755)
        other = files_root / "thread_other"
        other.mkdir(mode=0o755)
        (other / "notes.txt").write_text("canary-other-thread")
        (other / "notes.txt").chmod(0o644)
        targets = [str(other / "notes.txt"), str(REPO_ROOT / "README.md"), str(REPO_ROOT / "pyproject.toml"),
                   "/etc/passwd", "/etc/shadow", "/root/.bashrc", str(Path.home() / ".bashrc")]  # fmt: skip
        code = f"""
import json
out = {{}}
for path in {targets!r}:
    try:
        out[path] = open(path).read()[:20]
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""
        found = run(code)
    finally:
        shutil.rmtree(files_root, ignore_errors=True)
    assert set(found.values()) == {"FileNotFoundError"}, found


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                alive = "State:\tZ" not in (entry / "status").read_text()
                if alive and marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("ending", ["returns", "times out"])
def test_a_double_forked_setsid_child_does_not_outlive_the_call(ending: str) -> None:
    marker = f"orphan-{os.getpid()}-{ending.replace(' ', '-')}"
    code = f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['{marker}', '300'])
    os._exit(0)
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    if any(b'{marker}' in open(f'/proc/{{p}}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()):
        print('orphan running', flush=True)
        break
    time.sleep(0.01)
{"time.sleep(60)" if ending == "times out" else ""}
"""
    result = run_code(code, timeout_s=8.0)
    assert "orphan running" in result.stdout, result
    assert result.timed_out is (ending == "times out")
    eventually(
        lambda: _processes_with(marker) == [],
        timeout=10,
        what="the orphan gone",
        detail=lambda: _processes_with(marker),
    )


def test_a_fork_bomb_hits_the_cap_as_root_too() -> None:
    code = """
import json, os, time
children, error = 0, None
try:
    for _ in range(1000):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as exc:
    error = type(exc).__name__
print(json.dumps({"children": children, "error": error}))
"""
    found = run(code)
    assert found["error"] == "BlockingIOError"  # EAGAIN: the process cap, not the 1000 asked for
    assert found["children"] < sandbox.EXTRA_PROCESSES  # type: ignore[operator]


def test_the_code_runs_unprivileged_with_no_capabilities_inside_and_out() -> None:
    code = """
import json, os
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
refused = libc.unshare(0x10000000) == -1  # CLONE_NEWUSER: a fresh user namespace would give capabilities back
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "cap_eff": status['CapEff'].strip(),
                  "cap_bnd": status['CapBnd'].strip(), "new_userns_refused": refused}))
"""
    found = run(code)
    assert (found["uid"], found["gid"]) == (isolation.UNPRIVILEGED_ID, isolation.UNPRIVILEGED_ID)
    assert int(str(found["cap_eff"]), 16) == 0 and int(str(found["cap_bnd"]), 16) == 0
    assert found["new_userns_refused"] is True


def test_seen_from_the_host_the_code_is_not_root() -> None:
    """Outside the namespace the code's processes belong to the unprivileged user when the worker
    is root (the kernel would exempt root from the process cap), else to the worker's user."""
    marker = f"whoami-{os.getpid()}"
    results: list[object] = []
    code = f"import os\nos.execv('/bin/sleep', ['{marker}', '20'])"
    runner = threading.Thread(target=lambda: results.append(run_code(code, timeout_s=2.0)))
    runner.start()
    try:
        pids = eventually(lambda: _processes_with(marker), timeout=15, what="the sandboxed process showing up")
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pids[0]}/status").read_text().splitlines() if ":" in line
        )
    finally:
        runner.join(30)
    expected = isolation.UNPRIVILEGED_ID if os.geteuid() == 0 else os.geteuid()
    assert {int(uid) for uid in status["Uid"].split()} == {expected}
    assert {int(gid) for gid in status["Gid"].split()} == {
        isolation.UNPRIVILEGED_ID if os.geteuid() == 0 else os.getegid()
    }
    assert status["Groups"].strip() in ("", str(isolation.UNPRIVILEGED_ID))  # root's groups are dropped too


def test_the_system_is_read_only_and_only_the_scratch_area_is_writable() -> None:
    code = """
import json
out = {}
for path in ('/usr/evil', '/etc/evil', '/evil', '/proc/evil', '/sandbox/ok', '/tmp/ok'):
    try:
        open(path, 'w').write('x')
        out[path] = 'written'
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""
    found = run(code)
    assert found.pop("/sandbox/ok") == "written" and found.pop("/tmp/ok") == "written"
    assert set(found.values()) <= {"OSError", "PermissionError", "FileNotFoundError"}, found
    assert not Path("/usr/evil").exists() and not Path("/evil").exists()


def test_the_existing_limits_hold_inside_the_sandbox() -> None:
    big = run_code("f = open('big', 'wb')\nf.write(b'x' * (65 * 2**20))", timeout_s=20.0)
    # Python ignores SIGXFSZ, so the write fails instead of the process dying.
    assert big.ok is False and ("File too large" in (big.error or "") or "size limit" in (big.error or ""))
    memory = run_code("b = bytearray(600 * 2**20)", memory_mb=128, timeout_s=20.0)
    assert memory.ok is False
    slow = run_code("while True:\n    pass", timeout_s=1.0)
    assert slow.timed_out is True
    loud = run_code("print('x' * 5000)", max_output_bytes=100)
    assert "[output truncated" in loud.stdout


def test_without_bwrap_run_code_refuses_unless_the_caller_opts_out_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "find_bwrap", lambda: None)
    refused = run_code("print('hi')")
    assert refused.ok is False and refused.exit_code is None
    assert refused.error == isolation.BWRAP_MISSING
    assert "bubblewrap" in refused.error and "unsandboxed=True" in refused.error
    allowed = run_code("print('hi')", unsandboxed=True)
    assert allowed.ok and allowed.stdout == "hi\n"


# -- scratch space and /dev: capped as a whole, never the host's --------------------------------

WRITE = """
import json, os
out = {{"written": 0, "error": None}}
try:
    for path in {paths!r}:
        with open(path, "wb") as f:
            for _ in range({chunks}):
                f.write(b"x" * 2**20)
                f.flush()
                out["written"] += 1
except OSError as exc:
    out["error"] = type(exc).__name__ + ": " + (exc.strerror or "")
print(json.dumps(out))
"""


def test_dev_shm_is_capped_with_the_scratch_space() -> None:
    found = run(WRITE.format(paths=["/dev/shm/big"], chunks=160))
    assert found["error"] == "OSError: No space left on device", found
    assert found["written"] <= isolation.SHM_BYTES // 2**20  # type: ignore[operator]


def test_nothing_can_be_created_in_dev() -> None:
    code = """
import json, os
out = {}
for path in ('/dev/evil', '/dev/pts/evil', '/dev/null2'):
    try:
        open(path, 'w').write('x')
        out[path] = 'written'
    except OSError as exc:
        out[path] = type(exc).__name__
try:
    os.mkdir('/dev/dir')
    out['mkdir'] = 'made'
except OSError as exc:
    out['mkdir'] = type(exc).__name__
open('/dev/null', 'w').write('x')  # the usual device nodes still work
out['urandom'] = len(open('/dev/urandom', 'rb').read(4))
print(json.dumps(out))
"""
    found = run(code)
    assert found.pop("urandom") == 4
    assert set(found.values()) <= {"OSError", "PermissionError"}, found


def test_the_scratch_space_is_capped_as_a_whole_not_per_file() -> None:
    # 4 files of 50 MiB, each under the per-file limit, in /sandbox and /tmp: 200 MiB in all.
    paths = ["/sandbox/a", "/sandbox/b", "/tmp/c", "/tmp/d"]
    found = run(WRITE.format(paths=paths, chunks=50))
    assert found["error"] == "OSError: No space left on device", found
    assert found["written"] <= isolation.SCRATCH_TOTAL_BYTES // 2**20  # type: ignore[operator]


def test_mountinfo_names_no_host_scratch_path() -> None:
    result = run_code("print(open('/proc/self/mountinfo').read())")
    assert result.ok, result
    assert "threads-code-" not in result.stdout
    assert tempfile.gettempdir() + "/" not in result.stdout
    mounts = [line.split() for line in result.stdout.splitlines() if line.strip()]
    writable = {fields[4]: fields for fields in mounts if fields[5].split(",")[0] == "rw"}
    # Writable: the three scratch mounts, each a tmpfs of its own (no host directory); the
    # kernel's /proc and /dev/pts; the usual device nodes (files, not directories). Nothing else.
    devices = {f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom", "tty")}
    assert set(writable) - devices == {"/sandbox", "/tmp", "/dev/shm", "/proc", "/dev/pts"}, writable
    for point in ("/sandbox", "/tmp", "/dev/shm"):
        fields = writable[point]
        assert fields[3] == "/" and fields[fields.index("-") + 1] == "tmpfs", fields


def test_a_bwrap_that_cannot_size_a_tmpfs_is_refused_not_used_uncapped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old = tmp_path / "bwrap"
    old.write_text("#!/bin/sh\necho 'usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]  --tmpfs DEST'\n")
    old.chmod(0o755)
    monkeypatch.setattr(isolation, "find_bwrap", lambda: str(old))
    refused = run_code("print('hi')")
    assert refused.ok is False and refused.exit_code is None
    assert refused.error == isolation.BWRAP_WITHOUT_SIZE and "--size" in refused.error
