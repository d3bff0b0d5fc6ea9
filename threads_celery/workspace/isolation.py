"""The bubblewrap sandbox ``run_code`` puts code in: namespaces, mounts and the identity it runs as.

`bubblewrap <https://github.com/containers/bubblewrap>`_ (``bwrap``, Debian package
``bubblewrap``) starts the code in new user, PID, network, IPC, UTS and mount namespaces:

- **user**: the code runs as uid/gid 65534 (``nobody``) with no capabilities and cannot create
  further user namespaces. A worker running as root starts ``bwrap`` itself as 65534, so that
  outside the namespace too the code's processes belong to an unprivileged user (the kernel
  exempts root from the process-count limit, and a root-owned namespace would make every escape
  a root escape);
- **PID**: the code sees only its own processes (no ``/proc/<worker>/environ``), and when the
  sandbox's first process ends, the kernel kills every process left in it, double-forked
  ``setsid()`` children included;
- **network**: only a loopback of its own, unless the call asks for the network; then it shares
  the worker's network, loopback services included (say so to whoever turns it on);
- **mount**: an empty root, read-only, holding ``/usr`` (and the ``/bin``, ``/lib`` links to it),
  the few ``/etc`` files the dynamic linker and name resolution read, the interpreter's own
  prefix, a fresh ``/proc``, a read-only ``/dev`` of the usual device nodes, and three
  size-limited tmpfs mounts, the only places the code may write: the call's scratch directory at
  :data:`SCRATCH`, ``/tmp`` and ``/dev/shm``, together :data:`SCRATCH_TOTAL_BYTES`. No host
  directory is bound writable, so ``/proc/self/mountinfo`` names no host scratch path. No home
  directory, project checkout, attachment folder or database socket is there.

This module decides (pure functions over paths and ids); :mod:`threads_celery.workspace.sandbox` starts
and supervises the process.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Where the call's scratch directory appears inside the sandbox (cwd, ``HOME``).
SCRATCH = "/sandbox"
#: The unprivileged identity the code has inside, and outside when the worker is root.
UNPRIVILEGED_ID = 65534
#: The scratch space of one call, ``/sandbox``, ``/tmp`` and ``/dev/shm`` together: three
#: size-limited tmpfs mounts (memory, never the host's disk) whose sizes add up to this. A budget
#: split rather than one tmpfs bound in three places: bubblewrap binds only host paths, and a host
#: directory would show its path in the sandbox's ``/proc/self/mountinfo``.
SCRATCH_TOTAL_BYTES = 176 * 2**20
#: ``/sandbox`` (cwd, ``HOME``) gets this much of :data:`SCRATCH_TOTAL_BYTES`: more than one file
#: may hold (``sandbox.MAX_FILE_BYTES``), so that limit still shows as its own error.
SANDBOX_BYTES = 96 * 2**20
#: ``/dev/shm`` (POSIX shared memory, ``multiprocessing``'s semaphores) gets this much.
SHM_BYTES = 16 * 2**20
#: ``/tmp`` gets the rest.
TMP_BYTES = SCRATCH_TOTAL_BYTES - SANDBOX_BYTES - SHM_BYTES

BWRAP_MISSING = (
    "run_code needs bubblewrap (`bwrap`; Debian/Ubuntu: apt-get install bubblewrap) to isolate "
    "the code, and it is not installed; install it, or pass unsandboxed=True to run the code "
    "without isolation (it can then read what the worker can, and reach the network)"
)

BWRAP_WITHOUT_SIZE = (
    "run_code caps each call's scratch space with size-limited tmpfs mounts (bubblewrap's --size, "
    "bubblewrap 0.5.0 or later), and the installed bwrap does not have it; upgrade bubblewrap"
)

_ETC_ALWAYS = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
_ETC_NETWORK = (
    "resolv.conf",
    "hosts",
    "nsswitch.conf",
    "gai.conf",
    "host.conf",
    "services",
    "protocols",
    "ssl",
    "ca-certificates",
)
_MERGED_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def find_bwrap() -> str | None:
    """The path of ``bwrap``, or None when it is not installed."""
    return shutil.which("bwrap") or (str(Path("/usr/bin/bwrap")) if os.access("/usr/bin/bwrap", os.X_OK) else None)


@functools.lru_cache(maxsize=8)
def bwrap_sizes_tmpfs(bwrap: str) -> bool:
    """True when ``bwrap`` can size a tmpfs (``--size``); without it the scratch space is uncapped."""
    try:
        shown = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return b"--size" in shown.stdout + shown.stderr


@dataclass(frozen=True, slots=True)
class Identity:
    """Who ``bwrap`` is started as: ``None`` for the worker's own user, else (uid, gid)."""

    drop_to: tuple[int, int] | None

    @property
    def dropping(self) -> bool:
        """True when the worker is root and starts the sandbox as the unprivileged user."""
        return self.drop_to is not None


def identity_for(euid: int) -> Identity:
    """Root starts the sandbox as :data:`UNPRIVILEGED_ID`; anyone else as themselves."""
    return Identity((UNPRIVILEGED_ID, UNPRIVILEGED_ID) if euid == 0 else None)


def reachable_by_others(path: str) -> bool:
    """True when a user who owns nothing here can reach and read ``path`` (every parent ``o+x``)."""
    target = Path(path)
    try:
        if not target.stat().st_mode & stat.S_IROTH:
            return False
        for parent in target.parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True


def python_for_sandbox(identity: Identity) -> tuple[str, str] | None:
    """(interpreter, prefix to mount) for Python inside the sandbox, or None when none is usable.

    The worker's own interpreter when the sandbox's user can read it; otherwise the system's
    ``/usr/bin/python3`` (a worker installed under ``/root`` is unreadable to ``nobody``). The code
    runs with ``-I -S`` either way: the standard library only.
    """
    candidates = [(os.path.realpath(sys.executable), sys.base_prefix)]
    for system in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(system):
            real = os.path.realpath(system)
            candidates.append((real, str(Path(real).parent.parent)))
    for interpreter, prefix in candidates:
        if not os.access(interpreter, os.X_OK):
            continue
        if identity.dropping and not (reachable_by_others(interpreter) and reachable_by_others(prefix)):
            continue
        return interpreter, prefix
    return None


def prefix_of(executable: str) -> str:
    """The installation prefix to mount for an interpreter (``.../bin/node`` -> ``...``)."""
    return str(Path(os.path.realpath(executable)).parent.parent)


def bwrap_argv(
    bwrap: str,
    *,
    entry_fd: int,
    entry_name: str,
    command: Sequence[str],
    network: bool = False,
    extra_read_only: Sequence[str] = (),
    root: Path = Path("/"),
) -> list[str]:
    """The ``bwrap`` command line that runs ``command`` in the sandbox described above.

    ``entry_fd`` is an open descriptor (passed to ``bwrap``) whose content becomes
    ``SCRATCH/entry_name``, the code's file, copied into the scratch tmpfs.

    ``extra_read_only`` are host paths mounted read-only at the same place (interpreter
    prefixes outside ``/usr``); ``root`` is where the host's ``/usr``, ``/etc``... are looked up
    (a test seam).
    """
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        *(["--share-net"] if network else []),
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--uid", str(UNPRIVILEGED_ID),
        "--gid", str(UNPRIVILEGED_ID),
        "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for name in _MERGED_USR_LINKS:
        host = root / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in (*_ETC_ALWAYS, *(_ETC_NETWORK if network else ())):
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--size", str(TMP_BYTES), "--tmpfs", "/tmp"]  # before the prefixes: one may live under /tmp
    mounted = {"/usr"}
    for path in extra_read_only:
        if len(Path(path).parts) < 3:
            continue  # never "/" or a whole top-level directory (/root, /home, /opt)
        if not any(path == m or path.startswith(m + "/") for m in mounted):
            argv += ["--ro-bind", path, path]
            mounted.add(path)
    argv += [
        "--proc", "/proc",
        # The usual device nodes, then read-only: nothing can be created in /dev. Only the
        # size-limited /dev/shm on top of it stays writable (the remount is not recursive).
        "--dev", "/dev",
        "--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", str(SANDBOX_BYTES), "--perms", "0700", "--tmpfs", SCRATCH,
        "--file", str(entry_fd), f"{SCRATCH}/{entry_name}",
        "--chdir", SCRATCH,
        "--remount-ro", "/",
        "--clearenv",
        *[part for name, value in sandbox_env().items() for part in ("--setenv", name, value)],
        "--",
        *command,
    ]  # fmt: skip
    return argv


def sandbox_env() -> dict[str, str]:
    """The whole environment the code sees inside the sandbox."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": SCRATCH, "TMPDIR": "/tmp"}
