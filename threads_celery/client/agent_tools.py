"""The agents-as-tools part of :class:`~threads_celery.client.threads.Threads` (a mixin).

Run a child agent for a parent thread (awaited or detached), inspect, list, cancel and clear the
parent's retained agent-tool runs.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from threads_celery.decisions.budgets import check_at
from threads_celery.definitions.agent_tools import Detached, DetachedHandle
from threads_celery.definitions.agents import Agent
from threads_celery.exceptions import ConfigError, RunTimeout, ThreadNotFound
from threads_celery.records import AGENT_TOOL_HARD_TERMINAL, AgentToolFailure, AgentToolResult, AgentToolRun
from threads_celery.telemetry.observability import emit
from threads_celery.transitions import agent_tool_dispatch, agent_tools, runs

if TYPE_CHECKING:
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.records import OutboxEntry, Run
    from threads_celery.store import Store
    from threads_celery.transitions.publishing import Publisher


class AgentToolsMixin:
    """Agents as tools, from code."""

    store: Store
    registry: AgentRegistry
    publisher: Publisher

    if TYPE_CHECKING:
        # Defined by Threads, which this mixin is part of; declared here so the mixin's use of
        # them is checked.
        def register(self, agent: Agent) -> Agent: ...

        def _cancel_awaited_children(self, run: Run, reason: str) -> None: ...

    # -- agents as tools -------------------------------------------------------------------

    def run_agent_tool(
        self,
        parent_thread_id: str,
        child: type[Agent] | Agent | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        parent_tool_call_id: str | None = None,
        display_order: int = 0,
        display_name: str | None = None,
        detached: bool | Detached | None = None,
        event_delivery: str = "all",
        timeout: float = 3600.0,
        signal: Any = None,
    ) -> AgentToolResult | AgentToolFailure | DetachedHandle:
        """Run a child agent for the parent thread, awaited (the default) or detached.

        Idempotent by ``run_id``: an id that exists never starts a second child; a finished run
        returns its retained result. Detached runs return a handle at once.
        """
        agent = self._child_agent(child)
        if event_delivery not in ("all", "terminal"):
            raise ConfigError(f"event_delivery must be 'all' or 'terminal', not {event_delivery!r}")
        options = Detached() if detached is True else (detached or None)
        if options is not None and not isinstance(options, Detached):
            raise ConfigError("detached must be True or a Detached(...) value")
        if options is not None and event_delivery == "terminal":
            raise ConfigError("detached runs do not support event_delivery='terminal'")
        if options is not None and signal is not None:
            warnings.warn(
                "a detached run does not inherit a cancellation signal; cancel it with cancel_agent_tool()",
                RuntimeWarning,
                stacklevel=2,
            )
        parent = self._parent_agent(parent_thread_id)
        if options is not None and options.on_finish is not None:
            method = getattr(parent, options.on_finish, None) if parent is not None else None
            if not callable(method):
                raise ConfigError(f"on_finish {options.on_finish!r} is not a method of the parent agent")
        run_id = run_id or runs.new_id("agent-tool")
        cap = getattr(parent, "max_concurrent_agent_tools", None)
        with self.store.transaction() as tx:
            row, entries, started = agent_tool_dispatch.dispatch(
                tx,
                run_id=run_id,
                parent_thread_id=parent_thread_id,
                child=agent,
                input_value=input,
                now=runs.utcnow(),
                parent_tool_call_id=parent_tool_call_id,
                display_order=display_order,
                display_name=display_name,
                detached=options,
                event_delivery=event_delivery,
                max_concurrent=cap,
            )
            if not started and row.status == "interrupted" and row.child_still_running:
                # Re-attach to a child given up on while it was still working, and re-arm the
                # backbone: its silence window starts again now.
                now = runs.utcnow()
                tx.update_agent_tool_run(
                    row.run_id,
                    status="running",
                    reason=None,
                    child_still_running=None,
                    error=None,
                    last_signal_at=now,
                    check_at=check_at(
                        started=row.started_at or now,
                        last_signal=now,
                        max_budget_ms=row.max_budget_ms,
                        no_progress_ms=row.no_progress_budget_ms,
                    ),
                )
        self.publisher(entries)
        if started:
            emit(
                "agent_tool",
                "agent_tool:dispatched",
                run_id=row.run_id,
                agent_type=row.agent_type,
                detached=options is not None,
            )
        if options is not None:
            status: Literal["running", "error"] = (
                "error" if row.status == "error" and not started and row.error and "cap" in row.error else "running"
            )
            return DetachedHandle(
                run_id=row.run_id,
                agent_type=row.agent_type,
                status=status,
                error=row.error if status == "error" else None,
            )
        return self._await_agent_tool(row.run_id, timeout)

    def _await_agent_tool(self, run_id: str, timeout: float) -> AgentToolResult | AgentToolFailure:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            row = self.inspect_agent_tool_run(run_id)
            # A completed run is awaited until its delivery is recorded too.
            if row is not None and row.is_terminal and (row.status in row.delivered or row.status != "completed"):
                result = row.result()
                assert result is not None
                return result
            if time.monotonic() >= deadline:
                raise RunTimeout(run_id, timeout, row.status if row else "unknown")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def _child_agent(self, child: type[Agent] | Agent | str) -> Agent:
        if isinstance(child, str):
            return self.registry.get(child)
        agent = child() if isinstance(child, type) else child
        if not isinstance(agent, Agent):
            raise ConfigError(f"the child must be an Agent (class, instance or name), not {type(child).__name__}")
        if agent.name not in self.registry:
            self.register(agent)
        return self.registry.get(agent.name)

    def _parent_agent(self, parent_thread_id: str) -> Agent | None:
        with self.store.read() as tx:
            name = tx.thread_agent(parent_thread_id)
        if name is None:
            raise ThreadNotFound(parent_thread_id)
        return self.registry.get(name) if name in self.registry else None

    def inspect_agent_tool_run(self, run_id: str) -> AgentToolRun | None:
        """The run's status snapshot with progress and milestones; None means "no record yet"."""
        with self.store.read() as tx:
            return tx.get_agent_tool_run(run_id, with_milestones=True)

    def has_agent_tool_run(self, parent_thread_id: str, agent: type[Agent] | Agent | str, run_id: str) -> bool:
        """Whether the parent's registry holds this run of this agent (gate drill-in with it)."""
        name = (
            agent
            if isinstance(agent, str)
            else (agent.name if isinstance(agent, Agent) else (agent.name or agent.__name__))
        )
        row = self.inspect_agent_tool_run(run_id)
        return row is not None and row.parent_thread_id == parent_thread_id and row.agent_type == name

    def agent_tool_runs(self, parent_thread_id: str, *, status: Iterable[str] | None = None) -> list[AgentToolRun]:
        """The parent thread's retained agent-tool runs, oldest first."""
        with self.store.read() as tx:
            return tx.list_agent_tool_runs(parent_thread_id, statuses=_statuses(status))

    def cancel_agent_tool(self, run_id: str, reason: str = "agent tool run was cancelled") -> AgentToolRun | None:
        """Cancel a running (or softly interrupted) run; a no-op for unknown or ended ones."""
        now = runs.utcnow()
        entries: list[OutboxEntry] = []
        with self.store.transaction() as tx:
            # The child's run and thread before its agent-tool row (runs.LOCK_ORDER).
            found = tx.get_agent_tool_run(run_id)
            if found is not None and found.child_run_id:
                locked = tx.get_run(found.child_run_id, lock=True)
                if locked is not None:
                    tx.get_thread(locked.thread_id, lock=True)
            row = tx.get_agent_tool_run(run_id, lock=True)
            if row is None or row.status in AGENT_TOOL_HARD_TERMINAL:
                return row
            child = tx.get_run(row.child_run_id) if row.child_run_id else None
            if child is not None and not child.is_terminal:
                _, entries = runs.cancel(tx, child.id, now=now, reason=reason)
            else:
                entries = agent_tools.child_finished(
                    tx, _AbortedChild(row), status="aborted", output=None, error=reason, now=now
                )
        self.publisher(entries)
        emit("agent_tool", "agent_tool:cancelled", run_id=run_id, agent_type=row.agent_type, reason=reason)
        if child is not None:
            self._cancel_awaited_children(child, reason)  # the child's own children, and so on down
        return self.inspect_agent_tool_run(run_id)

    def clear_agent_tool_runs(
        self, parent_thread_id: str, status: Iterable[str] | None = None, older_than: datetime | None = None
    ) -> int:
        """Delete retained runs (and their child threads); running ones are cancelled first."""
        with self.store.read() as tx:
            rows = tx.list_agent_tool_runs(parent_thread_id, statuses=_statuses(status), older_than=older_than)
        for row in rows:
            if agent_tools.is_active(row.status):
                self.cancel_agent_tool(row.run_id, reason="clearing agent tool run")
        with self.store.transaction() as tx:
            for row in rows:
                tx.delete_agent_tool_run(row.run_id, row.child_thread_id)
        return len(rows)


def _statuses(status: str | Iterable[str] | None) -> list[str] | None:
    """A status filter: one status or several (a bare string is one status, not its letters)."""
    if not status:
        return None
    return [status] if isinstance(status, str) else list(status)


class _AbortedChild:
    """Stands in for a child run that already ended when its agent-tool run is cancelled."""

    def __init__(self, row: AgentToolRun) -> None:
        self.agent_tool_run_id = row.run_id
