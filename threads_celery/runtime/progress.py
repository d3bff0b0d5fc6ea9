"""Progress and milestones reported from inside a child agent-tool run.

Ephemeral progress is coalesced (a report within 200 ms of the last one sent for the same run
is dropped; a report with ``fraction >= 1`` always goes out) and keeps the latest snapshot on
the agent-tool row. ``data`` reaches the parent's ``on_progress`` hook live, and is stored only
with ``persist=True``. A milestone is never coalesced: it is a durable row with a monotonic
per-run sequence, an event in the parent's log, and for detached runs configured with
``on_milestones`` a narrated line or a reaction turn in the parent thread, at most once each.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from threads_celery.records import AgentToolRun
from threads_celery.runtime.ports import Worker
from threads_celery.transitions import runs
from threads_celery.transitions.agent_tools import child_signal

if TYPE_CHECKING:
    from datetime import datetime

    from threads_celery.records import OutboxEntry
    from threads_celery.store import Tx

log = logging.getLogger("threads_celery.runtime.progress")

COALESCE_S = 0.2


class ProgressReporter:
    """Sends progress for the agent-tool runs of one worker process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._last_emit: dict[str, float] = {}
        self._lock = threading.Lock()

    def report(
        self,
        agent_tool_run_id: str,
        *,
        fraction: float | None = None,
        message: str | None = None,
        phase: str | None = None,
        milestone: str | None = None,
        data: Any = None,
        persist: bool = False,
    ) -> str:
        """Report progress; returns ``sent``, ``coalesced`` or ``inactive`` (the run has ended)."""
        if fraction is not None and (not isinstance(fraction, (int, float)) or fraction < 0):
            raise ValueError("fraction must be a number from 0 to 1")
        now_mono = time.monotonic()
        with self._lock:
            last = self._last_emit.get(agent_tool_run_id)
            urgent = milestone is not None or (fraction is not None and fraction >= 1)
            if not urgent and last is not None and now_mono - last < COALESCE_S:
                return "coalesced"
            self._last_emit[agent_tool_run_id] = now_mono
        now = self.worker.clock()
        snapshot = {
            k: v for k, v in {"fraction": fraction, "message": message, "phase": phase}.items() if v is not None
        }
        entries = []
        with self.worker.store.transaction() as tx:
            row: AgentToolRun | None = tx.get_agent_tool_run(agent_tool_run_id)
            if row is None or row.status not in ("starting", "running"):
                return "inactive"
            if milestone is not None:
                sequence = tx.insert_milestone(agent_tool_run_id, milestone, data, now)
                payload: dict[str, Any] = {"run_id": row.run_id, "sequence": sequence, "name": milestone, "data": data}
                tx.append_event(row.parent_thread_id, row.parent_run_id, "agent_tool.milestone", payload, now)
                entries = _surface_milestone(self.worker, tx, row, milestone, sequence, data, now)
            else:
                stored = {**snapshot, "data": data} if persist and data is not None else snapshot
                tx.update_agent_tool_run(agent_tool_run_id, progress=stored)
                tx.append_event(
                    row.parent_thread_id,
                    row.parent_run_id,
                    "agent_tool.progress",
                    {"run_id": row.run_id, **stored},
                    now,
                )
            child_signal(tx, agent_tool_run_id, now)
        self.worker.publish(entries)
        self._call_on_progress(row, {**snapshot, "milestone": milestone, "data": data})
        return "sent"

    def _call_on_progress(self, row: AgentToolRun, progress: dict[str, Any]) -> None:
        """The parent's ``on_progress`` hook: best effort, never fails the reporting tool."""
        try:
            with self.worker.store.read() as tx:
                name = tx.thread_agent(row.parent_thread_id)
            parent = self.worker.registry.get(name) if name is not None and name in self.worker.registry else None
            hook = getattr(parent, "on_progress", None)
            if callable(hook):
                hook(row, progress)
        except Exception as exc:  # noqa: BLE001 - an observing hook's failure is logged and ignored
            log.warning("on_progress for %s failed: %s: %s", row.run_id, type(exc).__name__, exc)


def _surface_milestone(
    worker: Worker, tx: Tx, row: AgentToolRun, name: str, sequence: int, data: Any, now: datetime
) -> list[OutboxEntry]:
    """Narrate or react to a milestone in the parent thread, at most once per (run, name)."""
    options = row.on_milestones
    if not row.detached or options is None or name not in options.get("names", ()):
        return []
    thread = tx.get_thread(row.parent_thread_id)
    if thread is None:
        return []
    parent = worker.registry.get(thread.agent) if thread.agent in worker.registry else None
    milestone = {"sequence": sequence, "name": name, "data": data}
    formatter = getattr(parent, "format_detached_milestone", None)
    label = row.display_name or row.agent_type
    text = formatter(row, milestone) if callable(formatter) else f"[{label}] reached {name}"
    if not text:
        return []
    key = f"detached-ms:{row.run_id}:{name}"
    meta = {"source": "agent-tool-milestone", "run_id": row.run_id, "agent_type": row.agent_type, "milestone": name}
    if options.get("mode") == "react":
        _, entries = runs.submit_run(
            tx,
            agent=thread.agent,
            config_hash=thread.config_hash,
            message=text,
            now=now,
            thread_id=row.parent_thread_id,
            run_id=f"milestone:{row.run_id}:{name}",
            input_meta={**meta, "key": key},
        )
        return entries
    # Narrate: an assistant status line and no model turn. It queues behind the parent's current
    # run like any message, so it never lands between a tool call and its result.
    _, entries = runs.submit_run(
        tx,
        agent=thread.agent,
        config_hash=thread.config_hash,
        message=text,
        now=now,
        thread_id=row.parent_thread_id,
        run_id=f"narrate:{row.run_id}:{name}",
        input_meta={**meta, "key": key, "narrate": True},
    )
    return entries
