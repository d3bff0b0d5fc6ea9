"""One cgroup per ``run_code`` call: its processes' memory and task count capped as a whole.

Per-process rlimits cap each process of a call, not the call: ten processes under a 256 MiB
address-space limit hold 2.5 GiB together. So each sandboxed call gets a child cgroup of its
own, created under a parent this worker may write to, with

- ``memory.max`` = the call's ``memory_mb`` and no swap (``memory.swap.max`` = 0); cgroup v1:
  ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``;
- ``pids.max`` = the call's whole task budget (processes and threads, the sandbox's own included).

The sandbox's first process enters it before it can run anything (see ``sandbox``'s gate); at the
end everything left in it is killed (v2 ``cgroup.kill``; v1 SIGKILL for every pid until it is
empty) and the directory removed. An OOM kill inside it (v2 ``memory.events`` ``oom_kill``; v1
``memory.oom_control``) is reported as the call's memory cap.

Where the parent comes from is the setting :data:`SETTING`: ``auto`` (the default: cgroup v2, then
v1, looked up from this process's own cgroups), ``v2``, ``v1``, or the absolute path of a cgroup v2
directory an operator prepared and delegated (``memory`` and ``pids`` in its
``cgroup.subtree_control``, or enableable there). Nothing found is an error, never a silent
per-process fallback: :func:`find_parent` raises :class:`CgroupUnavailable` with one line saying
what is missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SETTING = "THREADS_SANDBOX_CGROUP"
#: Children of the parent are named so: ``threads-code-<hex>``.
PREFIX = "threads-code-"
REMOVE_WAIT_S = 5.0
_CONTROLLERS = ("memory", "pids")
_HINT = (
    f"give the worker a delegated cgroup v2 directory with the memory and pids controllers "
    f"({SETTING}=/path/to/it) or writable cgroup v1 memory and pids hierarchies "
    f"(docs/workspace.md: 'Sandbox caps and the host settings that enforce them')"
)


class CgroupUnavailable(Exception):
    """No cgroup can cap a call's memory and tasks here; ``str()`` is the one-line reason."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A cgroup filesystem in ``/proc/self/mountinfo``: where it is and what it holds."""

    version: Literal[1, 2]
    root: str  # the cgroup path the mount shows at its mount point
    mountpoint: Path
    controllers: frozenset[str]  # v1: the hierarchy's controllers; v2: empty (see cgroup.controllers)


@dataclass(frozen=True, slots=True)
class Parent:
    """Where the calls' cgroups are created: one v2 directory, or the v1 memory and pids ones."""

    version: Literal[1, 2]
    memory: Path
    pids: Path

    def create(self, memory_bytes: int, max_tasks: int) -> CallCgroup:
        """A new child cgroup with the caps set, or :class:`CgroupUnavailable`."""
        name = PREFIX + uuid.uuid4().hex[:16]
        call = CallCgroup(self.version, tuple(dict.fromkeys((self.memory / name, self.pids / name))))
        try:
            for directory in call.dirs:
                _mkdir(directory)
                call.made.append(directory)
            memory, pids = self.memory / name, self.pids / name
            swap_file = "memory.swap.max" if self.version == 2 else "memory.memsw.limit_in_bytes"
            if self.version == 2:
                _write(memory / "memory.max", str(memory_bytes))
                swap_value = "0"
            else:
                _write(memory / "memory.limit_in_bytes", str(memory_bytes))
                swap_value = str(memory_bytes)  # memory + swap together: no swap on top
            if (memory / swap_file).exists():
                _write(memory / swap_file, swap_value)
            elif host_has_swap():
                raise CgroupUnavailable(f"{swap_file} is missing (no swap accounting) and the host has swap")
            _write(pids / "pids.max", str(max_tasks))
        except (OSError, CgroupUnavailable) as exc:
            call.remove()
            raise CgroupUnavailable(f"run_code could not set up the call's cgroup under {self.memory}: {exc}") from exc
        return call


@dataclass(slots=True)
class CallCgroup:
    """One call's cgroup (v2: one directory; v1: a memory one and a pids one)."""

    version: Literal[1, 2]
    dirs: tuple[Path, ...]
    made: list[Path] = field(default_factory=list)

    def enter(self, pid: int) -> None:
        """Move process ``pid`` (not yet running the code) into the cgroup; OSError when refused."""
        for directory in self.dirs:
            _write(directory / "cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        """How many of the call's processes the kernel killed for the memory cap."""
        memory = self.dirs[0]
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        fields = _key_values(memory / name)
        if "oom_kill" in fields:
            return fields["oom_kill"]
        if self.version == 1:  # kernels before 4.13 count no OOM kills: did it ever hit the cap?
            with contextlib.suppress(OSError, ValueError):
                return int((memory / "memory.failcnt").read_text().strip() or 0)
        return 0

    def kill(self) -> None:
        """SIGKILL everything in the cgroup, then wait (briefly) until it is empty."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:  # v1 (or v2 without cgroup.kill): a fork racing us is caught next round
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def pids(self) -> set[int]:
        """The processes in the cgroup now."""
        found: set[int] = set()
        for directory in self.made:
            with contextlib.suppress(OSError):
                found |= {int(line) for line in (directory / "cgroup.procs").read_text().split()}
        return found

    def remove(self) -> bool:
        """Remove the cgroup's directories (they must be empty); True when all are gone."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        for directory in reversed(self.made):
            while True:
                try:
                    _rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while its last tasks are released
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.01)
        self.made.clear()
        return True


def find_parent(
    setting: str = "auto",
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
) -> Parent:
    """The parent for the calls' cgroups that ``setting`` names, or :class:`CgroupUnavailable`.

    ``proc_cgroup`` and ``mountinfo`` are where this process's cgroups and mounts are read (a test
    seam).
    """
    choice = setting.strip() or "auto"
    if choice.startswith("/"):
        path = Path(choice)
        problem = _v2_problem(path, enable=True)
        if problem:
            raise CgroupUnavailable(
                f"run_code cannot cap memory and processes per call: {SETTING}={choice} {problem}; {_HINT}"
            )
        return Parent(2, path, path)
    if choice not in ("auto", "v1", "v2"):
        raise CgroupUnavailable(f"{SETTING} must be auto, v1, v2 or an absolute path, not {setting!r}")
    try:
        own = _own_cgroups(proc_cgroup.read_text())
        mounts = parse_mountinfo(mountinfo.read_text())
    except OSError as exc:
        raise CgroupUnavailable(
            f"run_code cannot cap memory and processes per call: cannot read this process's cgroups ({exc}); {_HINT}"
        ) from None
    problems: list[str] = []
    if choice in ("auto", "v2"):
        found = _find_v2(own, mounts, problems)
        if found is not None:
            return found
    if choice in ("auto", "v1"):
        found = _find_v1(own, mounts, problems)
        if found is not None:
            return found
    raise CgroupUnavailable(f"run_code cannot cap memory and processes per call: {'; '.join(problems)}; {_HINT}")


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts listed in ``/proc/self/mountinfo`` text."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mountpoint = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            mounts.append(Mount(2, fields[3], mountpoint, frozenset()))
        elif tail[0] == "cgroup":
            mounts.append(Mount(1, fields[3], mountpoint, frozenset(tail[2].split(","))))
    return mounts


def host_has_swap(swaps: Path = Path("/proc/swaps")) -> bool:
    """True when a swap device or file is active."""
    try:
        return len(swaps.read_text().strip().splitlines()) > 1
    except OSError:
        return False


def _own_cgroups(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path; ``""`` is the v2 (unified) one."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                own[controller] = parts[2]
    return own


def _located(mount: Mount, path: str) -> Path | None:
    """Where cgroup ``path`` is under ``mount``, or None when the mount does not show it."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return mount.mountpoint / path[len(root) :].lstrip("/")


def _find_v2(own: dict[str, str], mounts: list[Mount], problems: list[str]) -> Parent | None:
    unified = [m for m in mounts if m.version == 2]
    if "" not in own or not unified:
        problems.append("no cgroup v2 (unified) hierarchy is mounted")
        return None
    here = _located(unified[0], own[""])
    if here is None:
        problems.append(f"this process's cgroup v2 {own['']} is not under {unified[0].mountpoint}")
        return None
    tried = []
    # Our own cgroup holds processes, so (not being the root) it can parent controller-enabled
    # children only when it already has them enabled; else its parent, next to us.
    for candidate in (here, here.parent) if here != unified[0].mountpoint else (here,):
        problem = _v2_problem(candidate, enable=False)
        if problem is None:
            return Parent(2, candidate, candidate)
        tried.append(f"{candidate} {problem}")
    problems.append("cgroup v2: " + ", ".join(tried))
    return None


def _v2_problem(path: Path, *, enable: bool) -> str | None:
    """What keeps ``path`` from parenting capped v2 cgroups, or None when it can."""
    if not (path / "cgroup.controllers").is_file():
        return "is not a cgroup v2 directory"
    if not os.access(path, os.W_OK) or not os.access(path / "cgroup.subtree_control", os.W_OK):
        return "is not writable by this worker"
    available = set((path / "cgroup.controllers").read_text().split())
    missing = [c for c in _CONTROLLERS if c not in available]
    if missing:
        return f"lacks the {' and '.join(missing)} controller{'s' if len(missing) > 1 else ''}"
    enabled = set((path / "cgroup.subtree_control").read_text().split())
    absent = [c for c in _CONTROLLERS if c not in enabled]
    if absent and enable:
        try:
            _write(path / "cgroup.subtree_control", " ".join(f"+{c}" for c in absent))
            return None
        except OSError as exc:
            return f"cannot enable {' and '.join(absent)} in cgroup.subtree_control ({exc.strerror or exc}; it must hold no processes)"
    if absent:
        return f"has not enabled {' and '.join(absent)} in cgroup.subtree_control"
    return None


def _find_v1(own: dict[str, str], mounts: list[Mount], problems: list[str]) -> Parent | None:
    found: dict[str, Path] = {}
    for controller, marker in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
        mount = next((m for m in mounts if m.version == 1 and controller in m.controllers), None)
        if mount is None or controller not in own:
            problems.append(f"no cgroup v1 {controller} hierarchy is mounted")
            continue
        here = _located(mount, own[controller])
        if here is None or not here.is_dir():
            problems.append(f"this process's cgroup v1 {controller}:{own[controller]} is not under {mount.mountpoint}")
        elif not os.access(here, os.W_OK):
            problems.append(f"cgroup v1 {here} is not writable by this worker")
        elif controller == "memory" and not (here / marker).exists():
            problems.append(f"cgroup v1 {here} has no {marker}")
        else:
            found[controller] = here
    if len(found) < len(_CONTROLLERS):
        return None
    return Parent(1, found["memory"], found["pids"])


def _mkdir(path: Path) -> None:
    path.mkdir()  # the kernel fills it with the cgroup's interface files


def _rmdir(path: Path) -> None:
    path.rmdir()  # a cgroup's directory goes with its interface files, once no task is left


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _key_values(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, number = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(number)
    return values
