"""Every exception threads-celery raises, under one root and split by audience.

- :class:`ConfigError` is a developer mistake found at definition or configuration time.
- :class:`RuntimeFailure` and its children are runtime conditions a caller may handle
  (the store or broker is down, a run is unknown, a payload is too large).
- :class:`FenceLost` is internal control flow: a worker whose lease moved on stops writing.

Each class's docstring is its default message. Exceptions that carry fields define
``__reduce__`` so they survive pickling across a process or task boundary.
"""

from __future__ import annotations

from typing import Any


class ThreadsError(Exception):
    """threads-celery failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(ThreadsError, ValueError):
    """The definition or configuration is invalid."""


class SecretUndecryptable(ConfigError):
    """A stored secret cannot be decrypted with this process's THREADS_SECRET_KEY."""

    def __init__(self, name: str | None = None, message: str | None = None) -> None:
        self.name = name
        what = f"the stored secret {name!r}" if name else "a stored secret"
        super().__init__(
            message or f"{what} cannot be decrypted with this THREADS_SECRET_KEY: it was sealed with another key"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.message))


class ModelUnavailable(ConfigError):
    """An agent's model cannot be used in this process: its provider package is not installed, or
    its provider cannot be built here (no API key in the environment, an unknown provider).

    Raised before anything is recorded (``Threads.start`` of an embedded runtime, the CLI's
    ``run``, the HTTP API's ``POST /v1/runs``), and a worker ends such a run at its first step
    with this message, without retrying: installing a package or setting a key is what fixes
    it, not waiting.
    """


class RuntimeFailure(ThreadsError):
    """A run could not be carried out."""


class StoreUnavailable(RuntimeFailure):
    """The database cannot be reached."""


class BrokerUnavailable(RuntimeFailure):
    """The message broker cannot be reached."""


class UnknownAgent(RuntimeFailure, LookupError):
    """No agent of that name is registered."""


class RunNotFound(RuntimeFailure, LookupError):
    """No run has that id."""

    def __init__(self, run_id: str, message: str | None = None) -> None:
        self.run_id = run_id
        super().__init__(message or f"no run has id {run_id!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.message))


class ThreadNotFound(RuntimeFailure, LookupError):
    """No thread has that id."""

    def __init__(self, thread_id: str, message: str | None = None) -> None:
        self.thread_id = thread_id
        super().__init__(message or f"no thread has id {thread_id!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.message))


class ThreadBusy(RuntimeFailure):
    """The thread has a run that is not finished: its history cannot branch in place now."""

    def __init__(self, thread_id: str, run_id: str, message: str | None = None) -> None:
        self.thread_id, self.run_id = thread_id, run_id
        super().__init__(
            message
            or f"thread {thread_id!r} has run {run_id!r} in progress; wait for it to end or cancel it, then branch"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.run_id, self.message))


class BranchPointNotFound(RuntimeFailure, LookupError):
    """The branch point names no message of the thread's current branch."""

    def __init__(self, thread_id: str, seq: int, message: str | None = None) -> None:
        self.thread_id, self.seq = thread_id, seq
        super().__init__(message or f"message {seq} is not on the current branch of thread {thread_id!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.seq, self.message))


class PayloadTooLarge(RuntimeFailure):
    """The payload is larger than the configured limit."""

    def __init__(self, size: int, limit: int, what: str = "message") -> None:
        self.size, self.limit, self.what = size, limit, what
        super().__init__(f"{what} is {size} bytes, over the limit of {limit} bytes")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.size, self.limit, self.what))


class AgentCodeFailed(RuntimeFailure):
    """Code of the agent's that runs with its model turn (an instruction, a tool's prepare function,
    an output validator) raised: the run ends in error saying which, as it would in the agent's own
    framework, instead of the turn being retried as if the provider had failed."""


class RunTimeout(RuntimeFailure, TimeoutError):
    """The run did not finish in time."""

    def __init__(self, run_id: str, timeout: float, status: str) -> None:
        self.run_id, self.timeout, self.status = run_id, timeout, status
        super().__init__(f"run {run_id} did not finish within {timeout:g}s (status: {status})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.timeout, self.status))


class FenceLost(ThreadsError):
    """This worker no longer holds the run: its lease moved on and its writes are refused."""

    def __init__(self, run_id: str, fence: int) -> None:
        self.run_id, self.fence = run_id, fence
        super().__init__(f"run {run_id}: fence {fence} is stale; the write was refused")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.fence))


class RetryLater(Exception):
    """Not now: another worker holds the run, or a transient failure. Try again in ``countdown``.

    Raised by the step machine; the Celery task turns it into ``task.retry(countdown=...)``.
    ``failed`` says the try failed (a model step's error), and counts against the step's
    retries; a wait (a held run, a provider's advised delay, a rate window) does not.
    """

    def __init__(self, countdown: float, reason: str, *, failed: bool = False) -> None:
        super().__init__(reason)
        self.countdown = max(0.05, countdown)
        self.reason = reason
        self.failed = failed


class CallNotFound(RuntimeFailure, LookupError):
    """No tool call has that effect key."""

    def __init__(self, effect_key: str, message: str | None = None) -> None:
        self.effect_key = effect_key
        super().__init__(message or f"no tool call has effect key {effect_key!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.effect_key, self.message))


class CallStateError(RuntimeFailure):
    """The tool call is not in a state that allows this."""

    def __init__(self, effect_key: str, status: str, expected: str) -> None:
        self.effect_key, self.status, self.expected = effect_key, status, expected
        super().__init__(f"tool call {effect_key!r} is {status}, not {expected}; nothing was changed")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.effect_key, self.status, self.expected))


class InvalidArguments(RuntimeFailure, ValueError):
    """The arguments do not fit the tool's input schema."""


class AttachmentPathError(ThreadsError, ValueError):
    """The attachment name would reach outside the thread's files."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"attachment name {name!r} is refused: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.reason))


class AttachmentQuotaError(ThreadsError, OSError):
    """A write would take the thread's files past their size or file-count limit; nothing was written."""

    def __init__(self, thread_id: str, reason: str) -> None:
        self.thread_id, self.reason = thread_id, reason
        super().__init__(f"thread {thread_id!r}: {reason}; nothing was written and its earlier files are intact")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.reason))


class EffectUnknown(ThreadsError):
    """The tool cannot tell whether its effect happened (its remote end failed mid-call).

    Raised by a tool's ``execute``: a read_only call ends as a tool error the model sees; any
    other call parks for a person, as after a crash mid-call.
    """


class DeployRefused(RuntimeFailure):
    """The deploy command was refused; nothing was changed."""


class HistoryRefused(RuntimeFailure):
    """Export, erasure or retention refuses this thread now (it is running, holds a call whose
    effect has no outcome yet, or is held); nothing of it was changed."""

    def __init__(self, thread_id: str, reason: str) -> None:
        self.thread_id, self.reason = thread_id, reason
        super().__init__(reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.reason))


class HistoryFormatError(ThreadsError, ValueError):
    """A history export (or archive) cannot be read: not JSON Lines, no header, or a format
    version this release does not know."""
