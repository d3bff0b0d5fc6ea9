"""What a tool, hook, lookup or deps factory raised, turned into data the runtime can act on.

Tool code may raise anything: a ``BaseException`` subclass, one whose constructor needs an
argument (it cannot be unpickled in the prefork worker's main process, which then dies), one whose
``__str__``, ``__repr__`` or ``__reduce__`` raise, ``SystemExit`` or ``KeyboardInterrupt``. All of
them are handled in the pool process like an ordinary exception. Only the worker's and the
runtime's own control signals pass through (:func:`is_control`).

In a prefork pool process, Celery resets SIGTERM to its default action and ignores SIGINT, and
Celery's ``WorkerShutdown``/``WorkerTerminate`` are raised by the consumer, not inside a task: a
``SystemExit`` or ``KeyboardInterrupt`` seen around a tool's call comes from the tool's own code.
billiard's soft time limit (``SoftTimeLimitExceeded``) is an ``Exception`` and stays a tool error,
as before; its hard limit kills the process, which nothing here can see.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from billiard.exceptions import Terminated, WorkerLostError
from celery.exceptions import WorkerShutdown, WorkerTerminate

from threads_celery.decisions.retry import failed_outputs, model_retries
from threads_celery.exceptions import FenceLost, RetryLater
from threads_celery.redaction import describe_exception, known_secrets, redact_text
from threads_celery.runtime.pauses import PausedPastLease

if TYPE_CHECKING:
    from threads_celery.definitions.tools import Tool
    from threads_celery.runtime.history import ThreadHistory

# The runtime's and the worker's own control flow: never turned into a tool's error.
CONTROL = (PausedPastLease, FenceLost, RetryLater, WorkerShutdown, WorkerTerminate, Terminated, WorkerLostError)


def is_control(exc: BaseException) -> bool:
    """Whether ``exc`` is the runtime's or the worker's own signal, to be let through."""
    return isinstance(exc, CONTROL)


def type_name(exc: BaseException) -> str:
    """The exception's class name; a class whose name cannot be read is shown generically."""
    try:
        return str(type(exc).__name__)
    except Exception:  # noqa: BLE001 - a hostile metaclass must not take the call down
        return "BaseException"


def describe(exc: BaseException, secrets: Sequence[str]) -> str:
    """``describe_exception``, but never raising: a message that cannot be rendered is named so."""
    try:
        return redact_text(describe_exception(exc, secrets), secrets)
    except BaseException as failed:  # rendering runs hostile __str__/__repr__ code
        if is_control(failed):
            raise
        return f"{type_name(exc)} (its message could not be shown)"


def message(exc: BaseException, secrets: Sequence[str]) -> str:
    """``str(exc)`` with every form of every secret redacted, never raising.

    For exceptions whose message is meant to be read as is (an ``EffectUnknown``'s reason, a
    ``ToolOutputError``): no ``"<Type>: "`` prefix.
    """
    try:
        return redact_text(str(exc), secrets)
    except BaseException as failed:  # rendering runs hostile __str__ code
        if is_control(failed):
            raise
        return f"{type_name(exc)} (its message could not be shown)"


class ToolCodeFailed(Exception):
    """Something that escaped a task, replaced by a plain picklable exception.

    Carries a redacted one-line description only; the original is not pickled back to the
    worker's main process (it may not survive that).
    """


def survives_pickling(exc: BaseException) -> bool:
    """Whether ``exc`` is an ordinary ``Exception`` that pickles and unpickles as itself, as the
    prefork main process will do with it (only on a failure path: the round trip is not free)."""
    if not isinstance(exc, Exception):
        return False
    try:
        return type(pickle.loads(pickle.dumps(exc))) is type(exc)
    except BaseException as failed:  # a hostile __reduce__ or __init__
        if is_control(failed):
            raise
        return False


def retries_exhausted(
    tool: Tool, run_id: str, history: Callable[[], ThreadHistory], output_tools: frozenset[str] = frozenset()
) -> str | None:
    """Why the run ends, when ``tool`` was asked to retry as many model turns in a row as its
    ``max_retries`` allows and fails again, or an output tool fails once more than the run's
    ``output_retries`` allow (Pydantic AI's limits); None while it may retry. The thread's history
    is read only for a tool with a limit."""
    if tool.output_retries is not None:
        if failed_outputs(history().messages, run_id, output_tools) + 1 <= tool.output_retries:
            return None
        return f"Exceeded maximum output retries ({tool.output_retries})"
    if tool.max_retries is None:
        return None
    if model_retries(history().messages, run_id, tool.name) < tool.max_retries:
        return None
    return f"tool {tool.name!r} exceeded max retries count of {tool.max_retries}"


def picklable(exc: BaseException) -> ToolCodeFailed:
    """A plain exception standing for ``exc``, safe to pickle to the prefork main process."""
    return ToolCodeFailed(describe(exc, known_secrets()).replace("\n", " ")[:500])
