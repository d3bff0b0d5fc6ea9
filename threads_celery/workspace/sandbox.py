"""Run model- or user-authored code in a sandbox: what ``ctx.run_code`` calls.

Each call gets a fresh interpreter (Python with ``-I -S``: no site-packages, no ``PYTHON*``
variables, no user site; or Node.js for JavaScript) in a bubblewrap sandbox (see
:mod:`threads_celery.workspace.isolation`): new user, PID, network, IPC and mount namespaces, uid 65534
with no capabilities, a read-only system with size-limited scratch space of its own (``/sandbox``, ``/tmp``
and ``/dev/shm``: tmpfs mounts, gone with the sandbox), no view of the worker's processes, environment, files or sockets, and no network
unless the call asks for it (``network=True``). On top of that:

- an environment that holds nothing but ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR``;
- none of the worker's open file descriptors (``close_fds``);
- one cgroup per call (:mod:`threads_celery.workspace.cgroups`) capping the memory (no swap) and
  the number of tasks of all the call's processes together; where no cgroup can, ``run_code``
  refuses (one error line naming what is missing), never a silent per-process fallback;
- resource limits per process: address space (Python) or data segment plus V8 heap (Node.js, whose engine
  reserves far more address space than it uses), CPU seconds, open files, file size, core dumps,
  and a process count (inside the sandbox's user namespace the count covers this call only);
- when the call ends, at the wall-clock deadline, or when the caller's ``cancel()`` turns true,
  the sandbox is killed, and with its PID namespace every process the code started, however it
  detached itself;
- stdout and stderr captured up to a cap each, the rest drained and dropped with a note.

Limits are set by a tiny launcher that applies them and then ``exec``\\s the interpreter, instead
of a ``preexec_fn``: ``preexec_fn`` is unsafe in a process with threads (a Celery worker pool is
one) and may deadlock the child before ``exec``.

Without ``bwrap`` installed, ``run_code`` refuses (a :class:`CodeResult` whose ``error`` says
so). ``unsandboxed=True`` opts out of the sandbox: the code then runs as a limited subprocess of
the worker's own user, which can read what that user can read and reach the network, and whose
``setsid()`` children may outlive the call. Use it only for code you trust.

User-code failures never raise: a syntax error, an exception, a timeout, a memory cap hit or a
cancellation all come back as a :class:`CodeResult` the model can read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from threads_celery.workspace import cgroups, isolation

log = logging.getLogger("threads_celery.workspace.sandbox")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 256
DEFAULT_MAX_OUTPUT_BYTES = 1_000_000
MAX_FILE_BYTES = 64 * 2**20  # any one file the code writes
MAX_OPEN_FILES = 128
EXTRA_PROCESSES = 64  # threads and processes the code may start, on top of the user's own
#: The cgroup's ``pids.max``: every task of a sandboxed call, bubblewrap's two included.
MAX_TASKS = EXTRA_PROCESSES
#: Holds the sandbox until its pid is in the call's cgroup: the shell stops itself (SIGSTOP, which
#: nothing can catch), the worker sees it stopped, moves it, then continues it into ``exec``. No
#: descriptor to pass (a shell names only fds 0-9) and no ``preexec_fn``.
_GATE = 'kill -STOP $$; exec "$@"'
GATE_SHELL = "/bin/sh"
DRAIN_GRACE_S = 1.0  # how long to keep reading after the group was killed
POLL_S = 0.05

NODE_MISSING = "JavaScript needs Node.js, which is not installed"
Language = Literal["python", "javascript"]
_ALIASES: dict[str, Language] = {
    "python": "python",
    "python3": "python",
    "py": "python",
    "javascript": "javascript",
    "js": "javascript",
    "node": "javascript",
}
_ENTRY_FILES: dict[Language, str] = {"python": "main.py", "javascript": "main.js"}

# Applies the limits given as JSON in argv[1], then becomes argv[2:]. Runs under ``-I -S``.
_LAUNCHER = """\
import json, os, resource, sys
spec = json.loads(sys.argv[1])
for name, soft, hard in spec["limits"]:
    which = getattr(resource, name, None)
    if which is None:
        continue
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))
os.umask(0o077)
try:
    os.execv(spec["argv"][0], spec["argv"])
except OSError as exc:
    sys.stderr.write(f"cannot start {spec['argv'][0]}: {exc}\\n")
    os._exit(127)
"""


@dataclass(frozen=True, slots=True)
class CodeResult:
    """How a piece of code ran.

    ``ok`` is true only for a clean exit (status 0, not timed out, not cancelled). ``exit_code``
    is the process's status, negative for a signal (-9 for SIGKILL), None when it never started.
    ``timed_out`` means the wall-clock or CPU limit ended it; ``killed`` that a signal ended it
    (ours at the deadline or on cancel, or the kernel's); ``cancelled`` that the caller asked.
    ``error`` says in one line what went wrong, for the model; None when ``ok``.
    """

    ok: bool
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    killed: bool = False
    error: str | None = None
    cancelled: bool = False


def run_code(
    code: str,
    language: str = "python",
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    stdin: str | bytes | None = None,
    cancel: Callable[[], bool] | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    network: bool = False,
    unsandboxed: bool = False,
    cgroup: str | None = None,
) -> CodeResult:
    """Run ``code`` in a fresh, limited, sandboxed process and return what happened.

    ``language`` is ``"python"`` or ``"javascript"`` (Node.js, when installed). ``cancel`` is
    polled while the code runs; when it returns true the sandbox is killed. ``network=True``
    lets the code use the worker's network (loopback services included). ``unsandboxed=True``
    runs it without bubblewrap, as the worker's user (see the module's docstring), and without a
    cgroup: uncapped as a whole, for trusted code only. ``cgroup`` is where the call's cgroup is
    made (``auto``, ``v2``, ``v1`` or a delegated v2 directory; None: ``THREADS_SANDBOX_CGROUP``,
    default ``auto``; see :mod:`threads_celery.workspace.cgroups`). Blocks the
    calling thread: from an async tool, use ``await asyncio.to_thread(run_code, ...)``.
    Raises only for a caller's mistake (a non-positive limit); never for what the code does.
    """
    if not timeout_s > 0 or not memory_mb > 0 or not max_output_bytes > 0:
        raise ValueError("timeout_s, memory_mb and max_output_bytes must be positive")
    lang = _ALIASES.get(language.strip().lower())
    if lang is None:
        supported = ", ".join(sorted(set(_ALIASES.values())))
        return _not_started(f"unsupported language {language!r}; supported: {supported}")
    bwrap = None if unsandboxed else isolation.find_bwrap()
    if bwrap is None and not unsandboxed:
        return _not_started(isolation.BWRAP_MISSING)
    if bwrap is not None and not isolation.bwrap_sizes_tmpfs(bwrap):
        return _not_started(isolation.BWRAP_WITHOUT_SIZE)  # fail closed: never an uncapped scratch
    cgroup_parent: cgroups.Parent | None = None
    if bwrap is not None:
        if not os.access(GATE_SHELL, os.X_OK):
            return _not_started(f"run_code needs {GATE_SHELL} to start the sandbox inside its cgroup")
        try:
            cgroup_parent = cgroups.find_parent(
                cgroup if cgroup is not None else os.environ.get(cgroups.SETTING, "auto")
            )
        except cgroups.CgroupUnavailable as exc:
            return _not_started(str(exc))  # fail closed: never only per-process caps
    identity = isolation.identity_for(os.geteuid()) if bwrap else isolation.Identity(None)
    python, mounts = sys.executable, []
    if bwrap:
        found = isolation.python_for_sandbox(identity)
        if found is None:
            return _not_started("no Python interpreter the sandbox's user can read (install python3 under /usr)")
        python, prefix = found
        mounts.append(prefix)
    if lang == "javascript":
        node = shutil.which("node") or shutil.which("nodejs")
        if node is None:
            return _not_started(NODE_MISSING)
        if bwrap:
            node = os.path.realpath(node)
            if identity.dropping and not isolation.reachable_by_others(node):
                return _not_started(f"Node.js at {node} is not readable by the sandbox's user")
            mounts.append(isolation.prefix_of(node))
        interpreter = [node, f"--max-old-space-size={max(16, memory_mb)}"]
    else:
        interpreter = [python, "-I", "-S", "-B", "-X", "utf8"]

    argv = [python, "-I", "-S", "-c", _LAUNCHER]
    entry_name = _ENTRY_FILES[lang]
    with contextlib.ExitStack() as cleanup:
        try:
            pass_fds: tuple[int, ...] = ()
            if bwrap is None:
                workdir = Path(tempfile.mkdtemp(prefix="threads-code-"))
                cleanup.callback(_remove_tree, workdir)
                (workdir / entry_name).write_text(code, encoding="utf-8")
            else:
                # The sandbox's scratch is a size-limited tmpfs of its own, not a host directory
                # (whose path mountinfo would show): bubblewrap copies the code in from this
                # unnamed file.
                workdir = Path(isolation.SCRATCH)
                source = cleanup.enter_context(tempfile.TemporaryFile())
                source.write(code.encode("utf-8"))
                source.seek(0)
                pass_fds = (source.fileno(),)
            stdin_file: IO[bytes] | int = subprocess.DEVNULL
            if stdin is not None:
                # An unnamed file, not a pipe: a large stdin cannot block us while we read output.
                stdin_file = cleanup.enter_context(tempfile.TemporaryFile())
                stdin_file.write(stdin.encode() if isinstance(stdin, str) else stdin)
                stdin_file.seek(0)
        except (OSError, UnicodeError) as exc:
            return _not_started(f"could not prepare the code to run: {exc}")
        call_cgroup = None
        if cgroup_parent is not None:
            try:
                call_cgroup = cgroup_parent.create(memory_mb * 2**20, MAX_TASKS)
            except cgroups.CgroupUnavailable as exc:
                return _not_started(str(exc))
            cleanup.callback(_dispose, call_cgroup)
        spec = {
            "limits": _limits(lang, timeout_s, memory_mb, sandboxed=bwrap is not None),
            "argv": [*interpreter, entry_name],
        }
        command = [*argv, json.dumps(spec)]
        if bwrap is not None:
            command = isolation.bwrap_argv(
                bwrap,
                entry_fd=pass_fds[0],
                entry_name=entry_name,
                command=command,
                network=network,
                extra_read_only=mounts,
            )
        return _supervise(
            command,
            workdir if bwrap is None else Path("/"),
            _child_env(workdir) if bwrap is None else {"PATH": "/usr/bin:/bin"},
            stdin_file,
            pass_fds=pass_fds,
            drop_to=identity.drop_to,
            timeout_s=timeout_s,
            cancel=cancel,
            max_output_bytes=max_output_bytes,
            cgroup=call_cgroup,
            memory_mb=memory_mb,
        )


def _dispose(call: cgroups.CallCgroup) -> None:
    call.kill()
    if not call.remove():
        log.warning("could not remove the call's cgroup %s", ", ".join(map(str, call.dirs)))


def _not_started(error: str) -> CodeResult:
    return CodeResult(ok=False, exit_code=None, stdout="", stderr="", error=error)


def _limits(lang: Language, timeout_s: float, memory_mb: int, *, sandboxed: bool = False) -> list[tuple[str, int, int]]:
    memory = memory_mb * 2**20
    cpu = math.ceil(timeout_s) + 1  # a backstop to the wall clock; SIGXCPU first, then SIGKILL
    limits = [
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES, MAX_OPEN_FILES),
        ("RLIMIT_FSIZE", MAX_FILE_BYTES, MAX_FILE_BYTES),
        ("RLIMIT_CORE", 0, 0),
    ]
    if lang == "python":
        limits.append(("RLIMIT_AS", memory, memory))
    else:
        # V8 reserves gigabytes of address space up front, so an address-space cap stops Node
        # before it starts; the data segment counts what it actually writes to.
        limits.append(("RLIMIT_DATA", memory, memory))
    if sandboxed:
        # In the sandbox's own user namespace the kernel counts this call's tasks only, and
        # never as root (the sandbox's user is unprivileged outside too): a plain cap.
        limits.append(("RLIMIT_NPROC", EXTRA_PROCESSES, EXTRA_PROCESSES))
        return limits
    tasks = _tasks_of_this_user()
    if tasks is not None:
        # RLIMIT_NPROC counts every thread of the user, not of this process: cap what the code
        # may add on top of what already runs (stops a fork bomb). Root is exempt by the kernel.
        limits.append(("RLIMIT_NPROC", tasks + EXTRA_PROCESSES, tasks + EXTRA_PROCESSES))
    return limits


def _tasks_of_this_user() -> int | None:
    """Threads the current real user runs now (Linux), or None when unknown or root."""
    uid = os.getuid()
    if uid == 0 or not os.path.isdir("/proc/self/task"):
        return None
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                status = f.read()
        except OSError:
            continue  # it exited meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            total += int(fields.get("Threads", "1").strip() or 1)
    return total


def _child_env(workdir: Path) -> dict[str, str]:
    """The whole environment the code sees: nothing of the worker's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
    }


class _Capped:
    """Keeps the first ``limit`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n[output truncated: {self.total} bytes written, the first {len(self.kept)} kept]"
        return text


def _supervise(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    stdin: IO[bytes] | int,
    *,
    pass_fds: tuple[int, ...] = (),
    drop_to: tuple[int, int] | None = None,
    timeout_s: float,
    cancel: Callable[[], bool] | None,
    max_output_bytes: int,
    cgroup: cgroups.CallCgroup | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> CodeResult:
    if cgroup is not None:
        argv = [GATE_SHELL, "-c", _GATE, "sh", *argv]
    try:
        proc = _start(argv, cwd, env, stdin, pass_fds=pass_fds, drop_to=drop_to)
    except OSError as exc:
        return _not_started(f"could not start the interpreter: {exc}")
    if cgroup is not None:
        problem = _enter_cgroup(proc, cgroup)
        if problem is not None:
            return _not_started(problem)
    result = _watch(proc, timeout_s=timeout_s, cancel=cancel, max_output_bytes=max_output_bytes, cgroup=cgroup)
    if cgroup is not None:
        oom_kills = cgroup.oom_kills()
        if oom_kills:
            return _memory_cap_hit(result, oom_kills, memory_mb)
    return result


def _enter_cgroup(proc: subprocess.Popen[bytes], cgroup: cgroups.CallCgroup) -> str | None:
    """Move the stopped gate into ``cgroup`` and let it go on; the reason when it could not."""
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)  # it stops itself before anything else
    except ChildProcessError:
        status = None
    problem = None
    if status is None or not os.WIFSTOPPED(status):
        if status is not None:
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen
        problem = "the sandbox's gate ended before it could enter its cgroup"
    else:
        try:
            cgroup.enter(proc.pid)  # before it runs anything: all it starts stays in
        except OSError as exc:
            problem = f"run_code could not put the sandbox in its cgroup: {exc}"
    if problem is None:
        os.kill(proc.pid, signal.SIGCONT)
        return None
    _kill_group(proc)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)  # a stopped process dies of SIGKILL anyway; be sure
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return problem


def _start(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    stdin: IO[bytes] | int,
    *,
    pass_fds: tuple[int, ...],
    drop_to: tuple[int, int] | None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=stdin,
        # Dropped in the forked child before exec (no preexec_fn): a root worker starts the
        # sandbox as the unprivileged user.
        # (None, Popen's default, changes nothing.)
        user=drop_to[0] if drop_to else None,
        group=drop_to[1] if drop_to else None,
        extra_groups=[] if drop_to else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
        pass_fds=pass_fds,  # the code's file, for bubblewrap to copy into the scratch tmpfs
        start_new_session=True,  # its own session and process group: killed as one
    )


def _watch(
    proc: subprocess.Popen[bytes],
    *,
    timeout_s: float,
    cancel: Callable[[], bool] | None,
    max_output_bytes: int,
    cgroup: cgroups.CallCgroup | None,
) -> CodeResult:
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = _Capped(max_output_bytes), _Capped(max_output_bytes)
    sinks = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
    deadline = time.monotonic() + timeout_s
    timed_out = cancelled = False
    stop_at: float | None = None  # set once the group is killed: drain briefly, then stop
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stderr, selectors.EVENT_READ)
        try:
            while True:
                if selector.get_map():
                    for key, _ in selector.select(POLL_S):
                        data = os.read(key.fd, 65536)
                        if data:
                            sinks[key.fd].add(data)
                        else:
                            selector.unregister(key.fileobj)
                else:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(POLL_S)  # it closed its output but may still be running
                pipes_open = bool(selector.get_map())
                now = time.monotonic()
                if stop_at is not None:
                    if not pipes_open or now >= stop_at:
                        break  # past the grace, only something outside the group holds the pipes
                elif proc.poll() is not None:
                    if not pipes_open:
                        break
                    _kill_group(proc)  # it exited, but something it started holds the pipes
                    stop_at = now + DRAIN_GRACE_S
                elif now >= deadline:
                    timed_out = True
                    _kill_group(proc)
                    stop_at = now + DRAIN_GRACE_S
                elif cancel is not None and _asked_to_cancel(cancel):
                    cancelled = True
                    _kill_group(proc)
                    stop_at = now + DRAIN_GRACE_S
        finally:
            _kill_group(proc)  # sweep up anything it started, whatever happened above
            if cgroup is not None:
                cgroup.kill()  # and whatever left the group: the cgroup holds all of the call
            proc.stdout.close()
            proc.stderr.close()
    exit_code = proc.wait()
    if exit_code == -signal.SIGXCPU:
        timed_out = True  # the CPU-time backstop fired before the wall clock
    return _result(
        exit_code, stdout.text(), stderr.text(), timed_out=timed_out, cancelled=cancelled, timeout_s=timeout_s
    )


def _memory_cap_hit(result: CodeResult, oom_kills: int, memory_mb: int) -> CodeResult:
    """``result`` of a call whose processes the kernel killed at the cgroup's memory cap."""
    error = (
        f"memory cap hit: the call's processes together used more than {memory_mb} MiB, "
        f"and the kernel killed {oom_kills} of them"
    )
    if result.timed_out or result.cancelled:
        error = f"{result.error}; {error}"
    return CodeResult(
        ok=False,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        timed_out=result.timed_out,
        killed=result.killed,
        error=error,
        cancelled=result.cancelled,
    )


def _asked_to_cancel(cancel: Callable[[], bool]) -> bool:
    try:
        return bool(cancel())
    except Exception:  # a failing check must not kill the code nor escape as the code's failure
        log.warning("cancel check failed; the code keeps running", exc_info=True)
        return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _result(
    exit_code: int, stdout: str, stderr: str, *, timed_out: bool, cancelled: bool, timeout_s: float
) -> CodeResult:
    killed = exit_code < 0
    if timed_out:
        error: str | None = f"timed out after {timeout_s:g}s"
    elif cancelled:
        error = "cancelled by the caller"
    elif killed:
        error = f"killed by {_signal_name(-exit_code)}"
        if -exit_code == signal.SIGXFSZ:
            error += " (a file grew past the size limit)"
        elif "out of memory" in stderr.lower():
            error += " (out of memory)"
    elif exit_code != 0:
        error = f"exited with status {exit_code}"
        reason = _error_line(stderr)
        if reason:
            error += f": {reason[:200]}"
    else:
        error = None
    return CodeResult(
        ok=error is None,
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        killed=killed or timed_out or cancelled,
        error=error,
        cancelled=cancelled,
    )


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def _error_line(stderr: str) -> str | None:
    """The line naming the error (``ZeroDivisionError: ...``, ``RangeError: ...``), else the last."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if _ERROR_LINE.match(line)]
    if named:
        return named[-1]
    return lines[-1] if lines else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _remove_tree(path: Path) -> None:
    """Delete the working directory even where the code took its own permissions away."""

    def make_writable_and_retry(func: Callable[[str], object], failed: str, _: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
            func(failed)

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if path.exists():
        log.warning("could not remove the code's working directory %s", path)
