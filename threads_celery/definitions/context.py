"""The context a tool's ``execute(input, ctx)`` receives."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from threads_celery.exceptions import ConfigError
from threads_celery.records import UsageTotals
from threads_celery.settings import Settings
from threads_celery.workspace import sandbox
from threads_celery.workspace.files import FilesQuota, ThreadFiles
from threads_celery.workspace.sandbox import CodeResult

if TYPE_CHECKING:
    from threads_celery.definitions.agent_tools import Detached, DetachedHandle
    from threads_celery.definitions.agents import Agent

log = logging.getLogger("threads_celery.definitions.tools")

#: The model request of its run that the code running now belongs to (see :func:`current_run_step`).
_RUN_STEP: ContextVar[int] = ContextVar("threads_celery_run_step", default=0)


def current_run_step() -> int:
    """The number of the run's model request being made now, as Pydantic AI's ``RunContext.run_step``
    counts it (1 for the run's first request; 0 outside a model step)."""
    return _RUN_STEP.get()


@contextlib.contextmanager
def at_run_step(run_step: int) -> Iterator[None]:
    """Make :func:`current_run_step` ``run_step`` for the code run inside (a model step's request)."""
    token = _RUN_STEP.set(run_step)
    try:
        yield
    finally:
        _RUN_STEP.reset(token)


class ToolContext:
    """What a running tool call can see and do.

    ``effect_key`` is stable across every retry of this call: send it to your provider as the
    idempotency key. ``heartbeat()`` tells the runtime the worker is alive (it extends the call's
    lease); ``cancelled`` turns true when the run was cancelled, for tools that can stop early.
    ``files`` is this thread's attachment area; ``run_code(...)`` runs model- or user-authored
    code in a limited subprocess. Their defaults come from ``settings``.
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
        settings: Settings | None = None,
        start_child: Callable[..., DetachedHandle] | None = None,
        model_retries: Callable[[], int] | None = None,
        run_step: int = 0,
        retried_in_reply: Callable[[], list[str]] | None = None,
        usage: Callable[[], tuple[UsageTotals, int]] | None = None,
        count_usage: Callable[[int, int, int], None] | None = None,
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
        self._settings = settings or Settings()
        self._files: ThreadFiles | None = None
        self._start_child = start_child
        self._children_started = 0
        self._model_retries = model_retries
        #: The number of the run's model request whose reply asked for this call (1 for the run's
        #: first request): Pydantic AI's ``ctx.run_step`` in a tool.
        self.run_step = run_step
        self._retried_in_reply = retried_in_reply
        self._usage = usage
        self._count_usage = count_usage

    @property
    def model_retries(self) -> int:
        """How many model turns in a row this run's model was asked to call this tool again (the
        tool raised ``ModelRetry``, or its arguments did not validate): Pydantic AI's ``ctx.retry``.
        Read from the run's messages when asked."""
        return self._model_retries() if self._model_retries is not None else 0

    def retried_in_reply(self) -> list[str]:
        """The tools whose calls earlier in this model reply were asked to retry (``ModelRetry``, or
        arguments that did not validate), in order. Read from the run's messages when asked."""
        return self._retried_in_reply() if self._retried_in_reply is not None else []

    def run_usage(self) -> tuple[UsageTotals, int]:
        """What this run has used of its models up to the reply that asked for this call (its
        requests and tokens, as ``threads.usage(run_id=...)`` counts them), and how many of its
        tool calls of earlier turns succeeded: Pydantic AI's ``ctx.usage`` in a tool. Read from
        the ledger when asked."""
        return self._usage() if self._usage is not None else (UsageTotals(), 0)

    def count_usage(self, *, requests: int, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Count model requests this call made itself (a delegate agent it ran, a model it asked
        directly) in the run's usage, with the model step whose reply asked for the call; priced as
        the agent's model. Each call of this counts once more: call it after the requests, with
        what they used."""
        if requests < 0 or input_tokens < 0 or output_tokens < 0:
            raise ValueError("usage counts are not negative")
        if self._count_usage is not None and (requests or input_tokens or output_tokens):
            self._count_usage(requests, input_tokens, output_tokens)

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

    @property
    def files(self) -> ThreadFiles:
        """This thread's attachments, ``<files_root>/<thread_id>/`` (created on first write).

        Writes past the thread's quota (``THREADS_FILES_MAX_BYTES``, ``THREADS_FILES_MAX_COUNT``)
        raise :class:`~threads_celery.exceptions.AttachmentQuotaError` and write nothing.
        """
        if self._files is None:
            quota = FilesQuota(self._settings.files_max_bytes or None, self._settings.files_max_count or None)
            self._files = ThreadFiles(self._settings.files_root, self.thread_id, quota=quota)
        return self._files

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        stdin: str | bytes | None = None,
        network: bool = False,
        unsandboxed: bool = False,
    ) -> CodeResult:
        """Run code in a fresh, limited bubblewrap sandbox (see :mod:`threads_celery.workspace.sandbox`).

        Never raises for what the code does: failures, timeouts and memory caps come back in the
        :class:`~threads_celery.workspace.sandbox.CodeResult`. Cancelling the run stops the code. Blocks:
        from an async tool, ``await asyncio.to_thread(ctx.run_code, ...)``. ``network=True``
        gives the code the worker's network; ``unsandboxed=True`` runs it without the sandbox,
        as the worker's user (trusted code only; the only way to run code where ``bwrap`` is
        not installed).
        """
        return sandbox.run_code(
            code,
            language,
            timeout_s=timeout_s if timeout_s is not None else self._settings.code_timeout_s,
            memory_mb=memory_mb if memory_mb is not None else self._settings.code_memory_mb,
            stdin=stdin,
            cancel=lambda: self.cancelled,
            max_output_bytes=self._settings.code_max_output_bytes,
            network=network,
            unsandboxed=unsandboxed,
            cgroup=self._settings.sandbox_cgroup,
        )

    def run_agent_tool(
        self,
        child: type[Agent] | Agent | str,
        input: Any = None,
        *,
        detached: bool | Detached = True,
        run_id: str | None = None,
        display_name: str | None = None,
    ) -> DetachedHandle:
        """Start a child agent run in the background for this thread; returns its handle at once.

        ``child`` is an Agent (instance, class or registered name); ``detached`` is ``True`` or a
        :class:`~threads_celery.definitions.agent_tools.Detached` (its ``on_finish`` names a method of this
        run's agent). Detached only: a tool that waited on a child would hold its worker; expose
        the agent with ``agent_tool(...)`` to await it. Idempotent: without ``run_id`` the n-th
        child of this call is ``agent-tool:<effect_key>:<n>``, so a retried call re-attaches to
        the runs it started. Returns a :class:`~threads_celery.definitions.agent_tools.DetachedHandle`.
        """
        if self._start_child is None:
            raise ConfigError("run_agent_tool() is available only inside a running tool call")
        if run_id is None:
            run_id = f"agent-tool:{self.effect_key}:{self._children_started}"
        self._children_started += 1
        return self._start_child(child, input, detached=detached, run_id=run_id, display_name=display_name)
