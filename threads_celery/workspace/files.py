"""Per-thread attachments: each thread has a file area of its own, ``<files_root>/<thread_id>/``.

A tool reaches its thread's area as ``ctx.files``. Files are named by **references**: relative,
``/``-separated names such as ``"report.md"`` or ``"data/rows.csv"``, valid only in the thread
whose area holds them. Any name that could reach outside the area is refused with
:class:`~threads_celery.exceptions.AttachmentPathError` before anything is touched: ``..``
components, absolute paths, NUL bytes, backslashes, and names that resolve through a symlink to
somewhere outside the area.

When work crosses a thread boundary (an agent tool or prompt tool hands attachments to its child
thread, or a child hands results back), the files are **copied** and the receiving thread gets
references of its own (spec-tools §6): :func:`copy_into_child` and :func:`copy_back_to_parent`.
The runtime is to call these at those hand-offs (``init_attachments_property`` on the way in,
the child's attachment results on the way out); a reference is never handed across as is.

Writes are atomic (a temporary file in the same folder, then a rename), so a worker that dies
mid-write leaves the previous version or nothing, never half a file.

A :class:`FilesQuota` caps a thread's total bytes and number of files (``ctx.files`` gets the
one from the settings). A write that would pass either raises
:class:`~threads_celery.exceptions.AttachmentQuotaError` before anything is written, so the
earlier files stay as they were. The check and the write hold a lock on the area, so concurrent
calls of one thread cannot both squeeze under the limit. Files put in the area by other means
(through :meth:`ThreadFiles.path`) count from the next checked write on.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import filecmp
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from threads_celery.exceptions import AttachmentPathError, AttachmentQuotaError

_SAFE_AREA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_TEMP_PREFIX = ".threads-tmp-"
_LOCK_NAME = _TEMP_PREFIX + "lock"  # hidden from list() and from the usage count by the prefix


@dataclass(frozen=True, slots=True)
class FilesQuota:
    """Per-thread limits on attachments: total bytes and number of files (None: no limit)."""

    max_bytes: int | None = None
    max_files: int | None = None


def quota_breach(
    quota: FilesQuota, *, used_bytes: int, files: int, replaced_bytes: int | None, new_bytes: int
) -> str | None:
    """Why writing ``new_bytes`` (over a file of ``replaced_bytes``, None if new) breaks ``quota``.

    None when it fits. Pure: the caller measures the area.
    """
    after_bytes = used_bytes - (replaced_bytes or 0) + new_bytes
    if quota.max_bytes is not None and after_bytes > quota.max_bytes:
        return (
            f"writing {new_bytes:,} bytes would bring its files to {after_bytes:,} bytes, "
            f"over the limit of {quota.max_bytes:,} (THREADS_FILES_MAX_BYTES)"
        )
    if quota.max_files is not None and replaced_bytes is None and files + 1 > quota.max_files:
        return f"it already holds {files:,} files, the limit (THREADS_FILES_MAX_COUNT)"
    return None


def area_name(thread_id: str) -> str:
    """The folder name of a thread's area: the id itself when it is a safe file name.

    Thread ids may be chosen by callers, so an id that is not one plain path component (``/``,
    ``..``, odd characters, very long) is stored under a digest; safe ids never start with ``_``,
    so the two kinds cannot collide.
    """
    if _SAFE_AREA_NAME.match(thread_id):
        return thread_id
    return "_" + hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def normalize_reference(name: str | os.PathLike[str]) -> str:
    """``name`` as a canonical reference (``./a//b`` becomes ``a/b``), or AttachmentPathError."""
    raw = os.fspath(name)
    if not isinstance(raw, str):
        raise AttachmentPathError(repr(raw), "a reference must be text, not bytes")
    if "\x00" in raw:
        raise AttachmentPathError(raw, "it contains a NUL byte")
    if "\\" in raw:
        raise AttachmentPathError(raw, "use / to separate folders, not \\")
    if raw.startswith("/"):
        raise AttachmentPathError(raw, "it is an absolute path; give a name relative to the thread's files")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise AttachmentPathError(raw, "it climbs out with '..'")
    if not parts:
        raise AttachmentPathError(raw, "it names no file")
    return "/".join(parts)


class ThreadFiles:
    """The attachment area of one thread. Nothing is created on disk until the first write."""

    def __init__(self, root: str | os.PathLike[str], thread_id: str, *, quota: FilesQuota | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.thread_id = thread_id
        self.directory = self.root / area_name(thread_id)
        self.quota = quota or FilesQuota()

    def __repr__(self) -> str:
        return f"ThreadFiles({str(self.root)!r}, {self.thread_id!r})"

    def path(self, name: str | os.PathLike[str]) -> Path:
        """The absolute, symlink-free path of a reference, checked to lie inside the area."""
        reference = normalize_reference(name)
        area = self._area()
        resolved = (area / reference).resolve()
        if resolved == area or not resolved.is_relative_to(area):
            raise AttachmentPathError(reference, "it leads outside the thread's files through a symlink")
        return resolved

    # -- reading -----------------------------------------------------------------------------

    def exists(self, name: str | os.PathLike[str]) -> bool:
        """Whether the reference names a file in this area."""
        return self.path(name).is_file()

    def read_bytes(self, name: str | os.PathLike[str]) -> bytes:
        with self._open_for_reading(name) as f:
            return f.read()

    def read_text(self, name: str | os.PathLike[str], *, encoding: str = "utf-8") -> str:
        return self.read_bytes(name).decode(encoding)

    def list(self) -> builtins.list[str]:
        """The references of every file in the area, sorted (symlinks that escape are left out)."""
        area = self._area()
        if not area.is_dir():
            return []
        found: list[str] = []
        for folder, _dirs, names in os.walk(area):  # does not descend into symlinked folders
            for filename in names:
                if filename.startswith(_TEMP_PREFIX):
                    continue  # a write in progress
                reference = (Path(folder) / filename).relative_to(area).as_posix()
                try:
                    if self.path(reference).is_file():
                        found.append(reference)
                except AttachmentPathError:
                    continue
        return sorted(found)

    # -- writing -----------------------------------------------------------------------------

    def write_bytes(self, name: str | os.PathLike[str], data: bytes) -> str:
        """Write a file (atomically, creating folders) and return its reference."""
        reference = normalize_reference(name)
        target = self.path(reference)
        with self._quota_checked(target, len(data)):
            self._replace(target, lambda out: out.write(data))
        return reference

    def usage(self) -> tuple[int, int]:
        """(bytes, files) the area holds now (writes in progress not counted)."""
        area = self._area()
        total = count = 0
        if area.is_dir():
            for folder, _dirs, names in os.walk(area):
                for filename in names:
                    if filename.startswith(_TEMP_PREFIX):
                        continue
                    with contextlib.suppress(OSError):
                        total += os.lstat(os.path.join(folder, filename)).st_size
                        count += 1
        return total, count

    def write_text(self, name: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> str:
        return self.write_bytes(name, text.encode(encoding))

    def delete(self, name: str | os.PathLike[str]) -> bool:
        """Remove a file; False when there was none."""
        try:
            self.path(name).unlink()
        except FileNotFoundError:
            return False
        return True

    def copy_to(self, other: ThreadFiles, name: str | os.PathLike[str], dest_name: str | None = None) -> str:
        """Copy one file into ``other``'s area and return the reference valid in ``other``.

        The copy keeps ``dest_name`` (default: the same name) unless ``other`` already holds a
        different file there; then it takes the first free ``stem-2.ext``, ``stem-3.ext``, ...
        rather than overwrite it. A file with the same content is reused, so repeating a
        hand-off after a crash gives the same reference instead of a second copy.
        """
        source = self._existing_file(name)
        wanted = normalize_reference(dest_name if dest_name is not None else name)
        reference = other._free_reference(wanted, source)
        target = other.path(reference)
        if not target.exists():
            with source.open("rb") as src, other._quota_checked(target, os.fstat(src.fileno()).st_size):
                other._replace(target, lambda out: shutil.copyfileobj(src, out))
        return reference

    # -- internals ---------------------------------------------------------------------------

    def _area(self) -> Path:
        root = self.root.resolve()
        area = root / self.directory.name
        if area.is_symlink():
            raise AttachmentPathError(self.directory.name, "the thread's file area is a symlink")
        return area

    def _existing_file(self, name: str | os.PathLike[str]) -> Path:
        path = self.path(name)
        if not path.is_file():
            raise FileNotFoundError(f"thread {self.thread_id!r} has no attachment {normalize_reference(name)!r}")
        return path

    def _open_for_reading(self, name: str | os.PathLike[str]) -> IO[bytes]:
        path = self._existing_file(name)
        # The path was resolved a moment ago; O_NOFOLLOW refuses a symlink swapped in since.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        return os.fdopen(fd, "rb")

    @contextlib.contextmanager
    def _quota_checked(self, target: Path, new_bytes: int) -> Iterator[None]:
        """Hold the area's lock, refuse a write that breaks the quota, then let it happen."""
        if self.quota.max_bytes is None and self.quota.max_files is None:
            yield
            return
        area = self._area()
        area.mkdir(parents=True, exist_ok=True)
        fd = os.open(area / _LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            used, files = self.usage()
            replaced = target.stat().st_size if target.is_file() else None
            reason = quota_breach(
                self.quota, used_bytes=used, files=files, replaced_bytes=replaced, new_bytes=new_bytes
            )
            if reason is not None:
                raise AttachmentQuotaError(self.thread_id, reason)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _replace(self, target: Path, write: Callable[[IO[bytes]], object]) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                write(out)
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def _free_reference(self, wanted: str, source: Path) -> str:
        """``wanted``, or a numbered variant, that is absent here or already holds ``source``."""
        folder, _, filename = wanted.rpartition("/")
        dot = filename.find(".", 1)
        stem, suffix = (filename[:dot], filename[dot:]) if dot > 0 else (filename, "")
        for n in range(1, 10_000):
            candidate = wanted if n == 1 else f"{folder + '/' if folder else ''}{stem}-{n}{suffix}"
            path = self.path(candidate)
            if not path.exists() or (path.is_file() and filecmp.cmp(path, source, shallow=False)):
                return candidate
        raise FileExistsError(f"no free name for {wanted!r} in thread {self.thread_id!r}")


def _copy_all(source: ThreadFiles, destination: ThreadFiles, names: Iterable[str]) -> list[str]:
    names = list(names)
    for name in names:  # every name checked before anything is copied: all or nothing
        source._existing_file(name)
    return [source.copy_to(destination, name) for name in names]


def copy_into_child(parent_files: ThreadFiles, child_files: ThreadFiles, names: Iterable[str]) -> list[str]:
    """Copy the parent's attachments into a child thread; returns the child-local references.

    For agent-tool and prompt-tool hand-offs (the runtime calls it when it starts the child).
    """
    return _copy_all(parent_files, child_files, names)


def copy_back_to_parent(child_files: ThreadFiles, parent_files: ThreadFiles, names: Iterable[str]) -> list[str]:
    """Copy a child's attachments back to its parent; returns the parent-local references.

    For agent-tool and prompt-tool hand-offs (the runtime calls it when the child's result is
    delivered). A name the parent already uses for other content gets a numbered variant.
    """
    return _copy_all(child_files, parent_files, names)
