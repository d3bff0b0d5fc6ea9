"""Carrying out the subagent lifecycle tools an agent's relationships give its model.

The relationships and the three tools (``subagents``, ``subagent_create``,
``subagent_message``) are declared with the owning agent (see
:class:`~threads_celery.definitions.agents.SubagentRelationship`); a call of one never executes
code of its own: the step machine hands it to :func:`subagent_call`, which lists this thread's
instances or starts an agent-tool run on an instance's child thread and waits, holding no worker.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import Any

from threads_celery.definitions.agents import Agent, SubagentRelationship
from threads_celery.definitions.tools import Tool
from threads_celery.exceptions import ConfigError
from threads_celery.records import CallRow, Run
from threads_celery.runtime import child_runs
from threads_celery.runtime.outcomes import commit_call
from threads_celery.runtime.ports import Worker


def subagent_call(
    worker: Worker, run: Run, call: CallRow, agent: Agent, tool_: Tool, parsed: Any, now: datetime
) -> str:
    """Carry out one lifecycle call; errors go back to the model as the call's result."""
    relationships = {r.name: r for r in agent.subagents}
    if tool_.subagent_op == "list":
        with worker.store.read() as tx:
            rows = tx.list_agent_tool_runs(run.thread_id)
        instances: dict[str, dict[str, Any]] = {}
        for row in rows:
            if not (row.display_name and row.display_name.startswith("subagent:")):
                continue
            if row.child_thread_id is None:
                continue  # refused before it started (the concurrency cap): no instance exists
            instances[row.child_thread_id] = {
                "instance_id": row.child_thread_id,
                "subagent": row.display_name.removeprefix("subagent:"),
                "status": row.status,
                "last_reply": row.summary,
            }
        return commit_call(worker, run, run.fence, call, tool_, _json(list(instances.values())), is_error=False)
    if tool_.subagent_op == "create":
        relationship = relationships.get(parsed.subagent)
        if relationship is None or relationship.hidden:
            known = ", ".join(sorted(n for n, r in relationships.items() if not r.hidden)) or "none"
            content = f"unknown subagent {parsed.subagent!r}; known: {known}"
            return commit_call(worker, run, run.fence, call, tool_, content, is_error=True)
        labelled = _labelled(tool_, relationship)
        return child_runs.dispatch_child(
            worker, run, call, labelled, parsed, now, child=relationship.agent, input_value=parsed.message
        )
    if tool_.subagent_op == "message":
        with worker.store.read() as tx:
            thread = tx.get_thread(parsed.instance_id)
        relationship = next(
            (r for r in relationships.values() if thread is not None and r.agent.name == thread.agent), None
        )
        if thread is None or thread.parent_thread_id != run.thread_id or relationship is None:
            content = f"unknown subagent instance {parsed.instance_id!r}"
            return commit_call(worker, run, run.fence, call, tool_, content, is_error=True)
        labelled = _labelled(tool_, relationship)
        return child_runs.dispatch_child(
            worker,
            run,
            call,
            labelled,
            parsed,
            now,
            child=relationship.agent,
            child_thread_id=thread.id,
            input_value=parsed.message,
        )
    raise ConfigError(f"unknown subagent operation {tool_.subagent_op!r}")


def _labelled(tool_: Tool, relationship: SubagentRelationship) -> Tool:
    return replace(tool_, display_name=f"subagent:{relationship.name}")


def _json(value: Any) -> str:
    return json.dumps(value)
