"""Starting child runs from a tool call: agent-tool calls (awaited) and ``ctx.run_agent_tool``.

The parent waits holding no worker, and a retried call re-attaches to the child it started
instead of starting another.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from threads_celery.definitions.agent_tools import Detached, DetachedHandle
from threads_celery.definitions.agents import Agent
from threads_celery.definitions.prompts import child_message_for
from threads_celery.definitions.tools import Tool
from threads_celery.exceptions import AttachmentPathError, ConfigError, FenceLost
from threads_celery.records import CallRow, Run
from threads_celery.redaction import describe_exception
from threads_celery.runtime.delivery import settle_parent_call
from threads_celery.runtime.outcomes import commit_call
from threads_celery.runtime.ports import Worker
from threads_celery.telemetry.observability import emit
from threads_celery.transitions import agent_tool_dispatch, agent_tools
from threads_celery.workspace.files import ThreadFiles, copy_into_child


def dispatch_child(
    worker: Worker,
    run: Run,
    call: CallRow,
    tool: Tool,
    parsed: Any,
    now: datetime,
    *,
    child: Agent | None = None,
    child_thread_id: str | None = None,
    input_value: Any = None,
) -> str:
    """An agent-tool call: start (or re-attach to) the child; the parent waits holding no worker.

    Prompt tools map their input to the child's first message; subagent messages name the
    child thread (the instance) to continue.
    """
    run_id = f"agent-tool:{call.effect_key}"
    if input_value is None:
        arguments = parsed.model_dump(mode="json")
        input_value = child_message_for(tool.prompt_options, arguments)
        options = tool.prompt_options
        if options is not None and options.init_attachments_property and child_thread_id is None:
            # The child's thread id is derived from the run id, so a retry copies to the same
            # place (and the copies, same content, to the same references).
            child_thread_id = "thread_" + hashlib.sha256(run_id.encode()).hexdigest()[:32]
            names = arguments.get(options.init_attachments_property) or []
            try:
                refs = copy_into_child(
                    ThreadFiles(worker.settings.files_root, run.thread_id),
                    ThreadFiles(worker.settings.files_root, child_thread_id),
                    [str(n) for n in (names if isinstance(names, list) else [names])],
                )
            except (OSError, AttachmentPathError) as exc:
                # A name the parent does not have is the model's mistake to fix, not a crash.
                content = f"cannot hand the attachments to {tool.name}: {describe_exception(exc, ())}"
                return commit_call(worker, run, run.fence, call, tool, content, is_error=True)
            if refs:
                text = input_value if isinstance(input_value, str) else json.dumps(input_value)
                input_value = f"{text}\n\nAttachments: {', '.join(refs)}"
    child = child or tool.child_agent
    # The runtime sends only agent tools (child_agent set) and subagent creates (child given) here.
    assert child is not None, f"tool {tool.name!r} starts no child agent"
    with worker.store.transaction() as tx:
        if (
            tx.advance_run(run.id, fence=run.fence, now=now, status="waiting", lease_owner=None, lease_expires_at=None)
            is None
        ):
            raise FenceLost(run.id, run.fence)
        tx.update_call(
            call.effect_key, status="started", attempt=call.attempt + 1, first_started_at=call.first_started_at or now
        )
        tx.delete_outbox(call.effect_key)
        row, entries, started = agent_tool_dispatch.dispatch(
            tx,
            run_id=run_id,
            parent_thread_id=run.thread_id,
            child=child,
            input_value=input_value,
            child_thread_id=child_thread_id,
            now=now,
            parent_run_id=run.id,
            parent_tool_call_id=call.call_id,
            parent_effect_key=call.effect_key,
            display_name=tool.display_name,
            display_order=call.index,
            max_concurrent=getattr(worker.registry.get(run.agent), "max_concurrent_agent_tools", None),
            max_window_ms=getattr(worker.registry.get(run.agent), "agent_tool_max_window_ms", None),
        )
        if not started and row.is_terminal and row.status in row.delivered:
            # Refused (past the cap), or re-attached to a run whose finish was delivered
            # already: no delivery will come, so its result answers the call now.
            result = row.result()
            assert result is not None
            entries += settle_parent_call(tx, row, result, now, worker.registry)
        elif not started and row.is_terminal:
            # Re-attached to a run that already ended: deliver its retained result again.
            entry = agent_tools.deliver_entry(row.run_id, row.status)
            tx.insert_outbox(entry, now)
            entries.append(entry)
    worker.publish(entries)
    if started:
        emit("agent_tool", "agent_tool:dispatched", run_id=row.run_id, agent_type=row.agent_type, detached=False)
    return f"waiting on {row.agent_type} ({row.run_id})"


def start_detached_child(
    worker: Worker,
    run: Run,
    call: CallRow,
    child: type[Agent] | Agent | str,
    input_value: Any,
    *,
    detached: bool | Detached,
    run_id: str,
    display_name: str | None,
) -> DetachedHandle:
    """``ctx.run_agent_tool(...)``: start a detached child for the thread of the calling tool."""
    options = Detached() if detached is True else detached
    if not isinstance(options, Detached):
        raise ConfigError(
            "a tool starts child runs detached (detached=True or Detached(...)): waiting on one "
            "would hold this worker; expose the agent with agent_tool(...) to await it"
        )
    agent = worker.registry.get(child) if isinstance(child, str) else (child() if isinstance(child, type) else child)
    if not isinstance(agent, Agent):
        raise ConfigError(f"the child must be an Agent (class, instance or name), not {type(child).__name__}")
    worker.registry.add(agent)  # so this process can run its steps; other workers must load it too
    parent = worker.registry.get(run.agent)
    if options.on_finish is not None and not callable(getattr(parent, options.on_finish, None)):
        raise ConfigError(f"on_finish {options.on_finish!r} is not a method of agent {parent.name!r}")
    with worker.store.transaction() as tx:
        row, entries, started = agent_tool_dispatch.dispatch(
            tx,
            run_id=run_id,
            parent_thread_id=run.thread_id,
            child=agent,
            input_value=input_value,
            now=worker.clock(),
            parent_run_id=run.id,
            parent_tool_call_id=call.call_id,
            display_name=display_name,
            detached=options,
            max_concurrent=getattr(parent, "max_concurrent_agent_tools", None),
        )
    worker.publish(entries)
    refused = not started and row.status == "error"
    return DetachedHandle(
        run_id=row.run_id,
        agent_type=row.agent_type,
        status="error" if refused else "running",
        error=row.error if refused else None,
    )
