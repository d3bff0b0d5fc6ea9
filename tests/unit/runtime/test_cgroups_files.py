"""The cgroup file protocol of run_code's per-call caps, on a fake cgroupfs in ``tmp_path``.

This host may have no cgroup v2 memory controller (or no v1), so each version's protocol is
checked here against files laid out as the kernel lays them out: finding the parent, the caps
written to a new call's cgroup, entering it, killing what is left, OOM kills and removal.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from threads_celery.workspace import cgroups

V2_FILES = {"cgroup.procs": "", "cgroup.kill": "", "memory.max": "max", "memory.swap.max": "max",
            "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n", "pids.max": "max"}  # fmt: skip
V1_MEMORY_FILES = {"cgroup.procs": "", "memory.limit_in_bytes": "9223372036854771712",
                   "memory.memsw.limit_in_bytes": "9223372036854771712", "memory.failcnt": "0",
                   "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"}  # fmt: skip
V1_PIDS_FILES = {"cgroup.procs": "", "pids.max": "max"}


@pytest.fixture(autouse=True)
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """mkdir fills a new cgroup with its interface files; rmdir takes them along."""

    def mkdir(path: Path) -> None:
        path.mkdir()
        parent = path.parent
        if (parent / "cgroup.controllers").exists():
            files = V2_FILES
        elif (parent / "memory.limit_in_bytes").exists():
            files = V1_MEMORY_FILES
        else:
            files = V1_PIDS_FILES
        for name, content in files.items():
            (path / name).write_text(content)
        if files is V2_FILES:
            (path / "cgroup.controllers").write_text((parent / "cgroup.subtree_control").read_text())
            (path / "cgroup.subtree_control").write_text("")

    monkeypatch.setattr(cgroups, "_mkdir", mkdir)
    monkeypatch.setattr(cgroups, "_rmdir", shutil.rmtree)


def v2_dir(path: Path, *, controllers: str = "cpu io memory pids", enabled: str = "") -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(enabled + "\n")
    (path / "cgroup.procs").write_text("")
    return path


def v2_host(tmp_path: Path, own: str) -> tuple[Path, Path]:
    mount = v2_dir(tmp_path / "cgroup", enabled="memory pids")
    proc_cgroup = tmp_path / "proc-cgroup"
    proc_cgroup.write_text(f"0::{own}\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"35 24 0:30 / {mount} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    return proc_cgroup, mountinfo


def test_a_delegated_v2_directory_gets_each_calls_caps_memory_no_swap_and_tasks(tmp_path: Path) -> None:
    delegated = v2_dir(tmp_path / "delegated", enabled="memory pids")
    parent = cgroups.find_parent(str(delegated))
    assert parent == cgroups.Parent(2, delegated, delegated)
    call = parent.create(256 * 2**20, 64)
    (directory,) = call.dirs
    assert directory.parent == delegated and directory.name.startswith(cgroups.PREFIX)
    assert (directory / "memory.max").read_text() == str(256 * 2**20)
    assert (directory / "memory.swap.max").read_text() == "0"
    assert (directory / "pids.max").read_text() == "64"
    call.enter(4242)
    assert (directory / "cgroup.procs").read_text() == "4242"


def test_a_delegated_v2_directory_without_the_controllers_enabled_gets_them(tmp_path: Path) -> None:
    delegated = v2_dir(tmp_path / "delegated", enabled="cpu")
    cgroups.find_parent(str(delegated))
    assert (delegated / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_a_v2_directory_without_the_pids_controller_is_refused_naming_it(tmp_path: Path) -> None:
    delegated = v2_dir(tmp_path / "delegated", controllers="cpu memory")
    with pytest.raises(cgroups.CgroupUnavailable) as refused:
        cgroups.find_parent(str(delegated))
    message = str(refused.value)
    assert "lacks the pids controller" in message and cgroups.SETTING in message and "\n" not in message


def test_a_path_that_is_no_cgroup_is_refused(tmp_path: Path) -> None:
    with pytest.raises(cgroups.CgroupUnavailable, match="is not a cgroup v2 directory"):
        cgroups.find_parent(str(tmp_path))


def test_auto_v2_skips_its_own_busy_cgroup_for_its_parent_which_has_the_controllers(tmp_path: Path) -> None:
    proc_cgroup, mountinfo = v2_host(tmp_path, "/worker")
    own = v2_dir(tmp_path / "cgroup" / "worker")  # holds the worker: nothing enabled below it
    parent = cgroups.find_parent("auto", proc_cgroup=proc_cgroup, mountinfo=mountinfo)
    assert parent.version == 2 and parent.memory == own.parent


def test_auto_refuses_in_one_line_when_neither_version_can_cap(tmp_path: Path) -> None:
    proc_cgroup, mountinfo = v2_host(tmp_path, "/a/worker")
    v2_dir(tmp_path / "cgroup" / "a", enabled="")
    v2_dir(tmp_path / "cgroup" / "a" / "worker")
    with pytest.raises(cgroups.CgroupUnavailable) as refused:
        cgroups.find_parent("auto", proc_cgroup=proc_cgroup, mountinfo=mountinfo)
    message = str(refused.value)
    assert "has not enabled memory and pids" in message
    assert "no cgroup v1 memory hierarchy" in message and "no cgroup v1 pids hierarchy" in message
    assert "\n" not in message and cgroups.SETTING in message


def test_kill_uses_cgroup_kill_and_the_oom_kills_are_read_from_memory_events(tmp_path: Path) -> None:
    call = cgroups.find_parent(str(v2_dir(tmp_path / "d", enabled="memory pids"))).create(2**20, 8)
    (directory,) = call.dirs
    call.kill()
    assert (directory / "cgroup.kill").read_text() == "1"
    assert call.oom_kills() == 0
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    assert call.oom_kills() == 2
    assert call.remove() and not directory.exists()


def test_v1_caps_memory_with_memsw_and_tasks_in_two_hierarchies(tmp_path: Path) -> None:
    memory_mount, pids_mount = tmp_path / "memory", tmp_path / "pids"
    own_memory = memory_mount / "jobs" / "me"
    own_memory.mkdir(parents=True)
    pids_mount.mkdir()
    for name, content in V1_MEMORY_FILES.items():
        (own_memory / name).write_text(content)
    (tmp_path / "proc-cgroup").write_text("8:pids:/\n4:memory:/jobs/me\n1:cpu,cpuacct:/\n0::/\n")
    (tmp_path / "mountinfo").write_text(
        f"40 30 0:40 / {memory_mount} rw - cgroup cgroup rw,memory\n"
        f"41 30 0:41 / {pids_mount} rw - cgroup cgroup rw,pids\n"
    )
    parent = cgroups.find_parent("v1", proc_cgroup=tmp_path / "proc-cgroup", mountinfo=tmp_path / "mountinfo")
    assert parent == cgroups.Parent(1, own_memory, pids_mount)
    call = parent.create(128 * 2**20, 32)
    memory, pids = call.dirs
    assert (memory / "memory.limit_in_bytes").read_text() == str(128 * 2**20)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(128 * 2**20)  # no swap on top
    assert (pids / "pids.max").read_text() == "32"
    call.enter(99)
    assert (memory / "cgroup.procs").read_text() == (pids / "cgroup.procs").read_text() == "99"
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert call.oom_kills() == 3
    assert call.remove() and not memory.exists() and not pids.exists()


def test_mountinfo_names_the_cgroup_mounts_and_their_roots() -> None:
    mounts = cgroups.parse_mountinfo(
        "24 1 0:22 / /sys rw - sysfs sysfs rw\n"
        "30 24 0:26 /docker/abc /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
        "31 24 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert mounts == [
        cgroups.Mount(1, "/docker/abc", Path("/sys/fs/cgroup/memory"), frozenset({"rw", "memory"})),
        cgroups.Mount(2, "/", Path("/sys/fs/cgroup/unified"), frozenset()),
    ]
