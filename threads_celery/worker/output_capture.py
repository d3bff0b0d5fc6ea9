"""A worker process's file descriptors 1 and 2, passed through redaction on their way out.

Python-level output is redacted where it is made (log records, ``print`` through the wrapped
``sys.stdout``). Below that, a tool can write to the descriptors themselves: ``os.write(1, ...)``,
a C library's ``printf``, a subprocess that inherited them. So in a worker's pool process each of
fds 1 and 2 becomes the write end of a pipe, and a thread of this module reads the pipe, redacts
every secret the process knows (:func:`threads_celery.redaction.known_secrets`: those of running
calls and those revealed to calls that ended) and writes the result to where the descriptor went
before.

A secret may arrive split across two reads. The reader passes on complete lines and holds back an
unfinished one; one that stays unfinished goes out after :data:`HOLD_S`. A line longer than
:data:`LONG_LINE` goes out in pieces, each cut where no form of a secret could straddle the cut.

Only pool processes (and the process of a ``solo`` or ``threads`` pool) capture: the embedded
worker runs inside its user's own process (a terminal, a test runner), whose descriptors are its
user's to manage.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import sys
import threading

from threads_celery.redaction import known_secrets, redactor_for

log = logging.getLogger("threads_celery.worker.output_capture")

#: How long an unfinished line (no newline yet) is held back before it goes out as it is.
HOLD_S = 0.05
#: An unfinished line longer than this goes out in pieces (minus a tail a secret could span).
LONG_LINE = 64 * 1024
#: At shutdown, how long the reader may take to pass on what is still in its pipe.
DRAIN_S = 2.0

_lock = threading.Lock()
_captures: dict[int, RedactedDescriptor] = {}


class RedactedDescriptor:
    """One file descriptor (1 or 2) turned into a pipe whose reader redacts and passes it on."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pid = os.getpid()
        self.original = os.dup(fd)  # where the output really goes
        os.set_inheritable(self.original, False)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)  # dup2 makes fd inheritable: subprocesses write into the pipe
        os.close(write_end)
        self._read_end = read_end
        self._pending = b""
        self._thread = threading.Thread(target=self._pump, name=f"threads-redact-fd{fd}", daemon=True)
        self._thread.start()

    def restore(self, timeout: float = DRAIN_S) -> None:
        """Give the descriptor its original target back and pass on what is left in the pipe.

        Anything still holding the pipe's write end (a subprocess still running) keeps writing
        into it for as long as the reader lives; the reader gives up after ``timeout``.
        """
        with contextlib.suppress(OSError):
            os.dup2(self.original, self.fd)
        self._thread.join(timeout)

    def _pump(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self._read_end], [], [], HOLD_S if self._pending else None)
                if not ready:  # an unfinished line that stayed unfinished
                    self._emit(final=True)
                    continue
                chunk = os.read(self._read_end, 65536)
                if not chunk:  # every write end is closed
                    self._emit(final=True)
                    return
                self._pending += chunk
                self._emit(final=False)
        except Exception:
            log.exception("fd %d: redacting reader stopped; the descriptor goes back to its target", self.fd)
            with contextlib.suppress(OSError):
                os.dup2(self.original, self.fd)

    def _emit(self, *, final: bool) -> None:
        pending = self._pending
        if not pending:
            return
        if final:
            cut = len(pending)
        else:
            cut = pending.rfind(b"\n") + 1
            if cut == 0 and len(pending) > LONG_LINE:
                cut = self._safe_cut(pending)
        if cut == 0:
            return
        out, self._pending = pending[:cut], pending[cut:]
        self._write(_redacted(out))

    def _safe_cut(self, pending: bytes) -> int:
        """Where to cut a long unfinished line: before its last ``longest`` characters, and
        before any form of a secret that would cross the cut."""
        text = pending.decode("utf-8", "surrogateescape")
        redactor = redactor_for(frozenset(known_secrets()))
        keep = redactor.longest if redactor is not None else 0
        cut = max(len(text) - keep, 0)
        if redactor is not None:
            for start, end in redactor.spans(text):
                if start < cut < end:
                    cut = start
        return len(text[:cut].encode("utf-8", "surrogateescape"))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.original, view)
            except InterruptedError:
                continue
            except OSError as exc:  # the target is gone (a closed terminal): drop, as a write would
                if exc.errno in (errno.EPIPE, errno.EBADF, errno.EIO):
                    return
                raise
            view = view[written:]


def _redacted(data: bytes) -> bytes:
    secrets = known_secrets()
    if not secrets:
        return data
    text = data.decode("utf-8", "surrogateescape")
    redactor = redactor_for(frozenset(secrets))
    if redactor is None:
        return data
    return redactor.redact(text).encode("utf-8", "surrogateescape")


def capture_output(fds: tuple[int, ...] = (1, 2)) -> None:
    """Pass ``fds`` of this process through redaction (idempotent; again after a fork)."""
    pid = os.getpid()
    with _lock:
        for fd in fds:
            current = _captures.get(fd)
            if current is not None and current.pid == pid:
                continue
            try:
                os.fstat(fd)
            except OSError:  # nothing open there: nothing to capture
                continue
            _flush_python_streams()  # what Python's buffers hold predates the pipe
            _captures[fd] = RedactedDescriptor(fd)


def release_output() -> None:
    """Undo :func:`capture_output` in this process, passing on what is still in the pipes."""
    pid = os.getpid()
    with _lock:
        captures = [c for c in _captures.values() if c.pid == pid]
        _captures.clear()
    _flush_python_streams()
    for capture in captures:
        capture.restore()


def is_captured(fd: int) -> bool:
    """Whether ``fd`` of this process goes through redaction."""
    current = _captures.get(fd)
    return current is not None and current.pid == os.getpid()


def _flush_python_streams() -> None:
    for stream in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()


__all__ = ["capture_output", "is_captured", "release_output"]
