"""Running a tool's reconcile lookup: the I/O shell around the pure recovery decision.

:func:`~threads_celery.decisions.effects.decide_recovery` answers
:class:`~threads_celery.decisions.effects.NeedsLookup` for an interrupted reconcilable call; the
step machine then asks the tool's ``reconcile.lookup`` through :func:`run_lookup` and decides
again with the answer. The lookup is user code that may hang, raise or be async, so it runs on a
daemon thread bounded by ``Reconcile.timeout_s``, and every way of not answering becomes a
:class:`~threads_celery.decisions.effects.LookupFailed` value the decision parks on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from threads_celery.decisions.effects import Found, LookupAnswer, LookupFailed, LookupUnknown, NotFound, Reconcile
from threads_celery.redaction import describe_exception, known_secrets

__all__ = ["run_lookup"]


def run_lookup(reconcile: Reconcile, effect_key: str) -> LookupAnswer | LookupFailed:
    """Ask ``reconcile.lookup`` about ``effect_key`` and return its answer or why there is none.

    This is the thin I/O shell around
    :func:`~threads_celery.decisions.effects.decide_recovery`. The lookup may be sync or async
    (a returned awaitable is run in a fresh event loop); either way it runs on a daemon thread,
    so a lookup that hangs cannot hold the caller past ``reconcile.timeout_s`` and the caller
    may itself be inside an event loop. Never raises for the lookup's sake: an exception becomes
    ``LookupFailed("lookup raised <Type>: <message>")``, a timeout
    ``LookupFailed("lookup did not answer within <N> s")`` and a value that is not a
    :data:`LookupAnswer` a :class:`LookupFailed` that names its type.
    """
    attempt = _LookupAttempt(reconcile.lookup, effect_key)
    thread = threading.Thread(target=attempt.run, name=f"reconcile-lookup:{effect_key}", daemon=True)
    thread.start()
    if not attempt.done.wait(reconcile.timeout_s):
        # A hung sync lookup cannot be stopped from outside; the daemon thread is abandoned.
        # A hung coroutine can be: cancel it so its loop closes and the thread ends.
        attempt.cancel()
        return LookupFailed(f"lookup did not answer within {reconcile.timeout_s:g} s")
    if attempt.error is not None:
        return LookupFailed(_describe_exception(attempt.error))
    answer = attempt.answer
    if not isinstance(answer, Found | NotFound | LookupUnknown):
        return LookupFailed(f"lookup returned {type(answer).__name__}, expected Found, NotFound or LookupUnknown")
    return answer


class _LookupAttempt:
    """One lookup call running on its own thread; the caller reads it once ``done`` is set."""

    def __init__(self, lookup: Callable[[str], object], effect_key: str) -> None:
        self._lookup = lookup
        self._effect_key = effect_key
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelled = False
        self.done = threading.Event()
        self.answer: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            result = self._lookup(self._effect_key)
            if inspect.isawaitable(result):
                result = self._run_awaitable(result)
            self.answer = result
        # BaseException too: whatever escapes a thread is lost, and the caller should hear of it
        # now rather than at the timeout.
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.done.set()

    def _run_awaitable(self, awaitable: Awaitable[object]) -> object:
        with asyncio.Runner() as runner:
            loop = runner.get_loop()
            task = loop.create_task(_await(awaitable))
            with self._lock:
                self._loop, self._task = loop, task
                cancelled = self._cancelled
            if cancelled:
                task.cancel()
            return loop.run_until_complete(task)

    def cancel(self) -> None:
        """Cancel the lookup's coroutine, if it is one; a sync lookup is left to finish alone."""
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            # RuntimeError: the loop already closed, so the coroutine has finished.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)


def _await(awaitable: Awaitable[object]) -> Coroutine[Any, Any, object]:
    async def wait_for_it() -> object:
        return await awaitable

    return wait_for_it()


def _describe_exception(exc: BaseException) -> str:
    # Never raises, whatever the exception's __str__ does, and redacted of the secrets revealed
    # in this process: the text becomes a park reason people and Flower see.
    described = describe_exception(exc, known_secrets())
    return f"lookup raised {described.removesuffix(': ')}"
