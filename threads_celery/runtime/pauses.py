"""A tool whose process was stopped past its claim is stopped too, before it can act.

A worker's pool process can be stopped (SIGSTOP, job control) in the middle of a tool call and
continued much later. Its lease lapses meanwhile, and the backbone settles the call: a
reconcilable call whose lookup finds nothing is run again elsewhere, an unguarded one parks for
a person. Continued, the old execution would carry on where it stopped and could make its effect
then, a second time, after the lookup that said it never happened. Its late commit is refused by
the fence; the effect would not be.

So while a call that may act runs in a process's main thread, a handler of SIGCONT (which every
continue of a stopped process delivers, before the interrupted Python code runs on) asks whether
the call is still provably this process's (its lease renewed recently enough); if it is not, it
raises :class:`PausedPastLease` into the tool, which leaves it before its next statement. A
coroutine tool is left at its next ``await``. What the tool does not do, the backbone settles as
after a crash.

A pause without a signal (a frozen cgroup, a suspended virtual machine) is not seen here: for
those, a tool whose provider takes the call's effect key refuses the late duplicate itself.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_lock = threading.Lock()
_checks: list[Callable[[], None]] = []
_previous: Any = None
_installed = False


class PausedPastLease(BaseException):
    """The process was stopped while a call that may act was running, and continued once its
    lease could have lapsed: the call is no longer provably this process's, so the tool must not
    act now. A BaseException, so that a tool's own ``except Exception`` does not swallow it."""


def _on_continue(signum: int, frame: FrameType | None) -> None:
    for check in list(_checks):
        check()
    if callable(_previous):
        _previous(signum, frame)


def _install() -> bool:
    """Install the SIGCONT handler once per process; False where it cannot be (not the main thread)."""
    global _installed, _previous
    if not hasattr(signal, "SIGCONT") or threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if not _installed:
            _previous = signal.signal(signal.SIGCONT, _on_continue)
            _installed = True
    return True


@contextmanager
def stop_if_paused(still_held: Callable[[], bool]) -> Iterator[None]:
    """Raise :class:`PausedPastLease` into the block if the process is continued after a stop
    and ``still_held()`` (which must not block: it runs in a signal handler) says False.

    Off the main thread, where no signal handler can run, the block runs unguarded.
    """
    if not _install():
        yield
        return

    def check() -> None:
        if not still_held():
            raise PausedPastLease("the process was stopped past the call's lease")

    with _lock:
        _checks.append(check)
    try:
        yield
    finally:
        with _lock:
            _checks.remove(check)
