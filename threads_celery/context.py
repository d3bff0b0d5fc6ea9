"""The context a tool's ``execute(input, ctx)`` receives."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

log = logging.getLogger("threads_celery.tools")


class ToolContext:
    """What a running tool call can see and do.

    ``effect_key`` is stable across every retry of this call: send it to your provider as the
    idempotency key. ``heartbeat()`` tells the runtime the worker is alive (it extends the call's
    lease); ``cancelled`` turns true when the run was cancelled, for tools that can stop early.
    """

    def __init__(
        self,
        *,
        effect_key: str,
        run_id: str,
        thread_id: str,
        attempt: int,
        deps: Any = None,
        heartbeat: Callable[[], bool] | None = None,
        is_cancelled: Callable[[], bool] | None = None,
        env: Callable[[str], str | None] | None = None,
        report: Callable[..., str] | None = None,
    ) -> None:
        self.effect_key = effect_key
        self.run_id = run_id
        self.thread_id = thread_id
        self.attempt = attempt
        self.deps = deps
        self._heartbeat = heartbeat
        self._is_cancelled = is_cancelled
        self._env = env
        self._report = report
        self._cancel_checked_at = 0.0
        self._cancelled = False
        self._warned_progress = False

    def heartbeat(self) -> bool:
        """Extend this call's lease. Returns False if the run moved on without this worker."""
        return self._heartbeat() if self._heartbeat is not None else True

    @property
    def cancelled(self) -> bool:
        """True once the run was cancelled (checked against the store at most once a second)."""
        if self._cancelled or self._is_cancelled is None:
            return self._cancelled
        now = time.monotonic()
        if now - self._cancel_checked_at >= 1.0:
            self._cancel_checked_at = now
            self._cancelled = self._is_cancelled()
        return self._cancelled

    def env(self, name: str) -> str | None:
        """The value of a variable for this thread, or None when it has none."""
        return self._env(name) if self._env is not None else None

    def report_progress(
        self,
        *,
        fraction: float | None = None,
        message: str | None = None,
        phase: str | None = None,
        milestone: str | None = None,
        data: Any = None,
        persist: bool = False,
    ) -> str:
        """Report progress to the parent of the agent-tool run this tool runs in.

        Naming a ``milestone`` makes it durable. Outside an agent-tool run it does nothing (and
        warns once). Returns ``"sent"``, ``"coalesced"`` or ``"inactive"``.
        """
        if self._report is not None:
            return self._report(
                fraction=fraction, message=message, phase=phase, milestone=milestone, data=data, persist=persist
            )
        if not self._warned_progress:
            self._warned_progress = True
            warnings.warn(
                "report_progress() outside an agent-tool run does nothing",
                RuntimeWarning,
                stacklevel=2,
            )
        return "inactive"
