"""A task's outcome as the step machine's parts record it: a call's result, or the run's end.

:func:`commit_call` commits the result of a call, whatever decided it (the tool's own result, a
denial, a hook's refusal, a record its reconcile lookup found, a subagent listing): a concurrent
call's through :mod:`.batches`, any other's with what runs next, in one fenced transaction.
:func:`finish_run` ends a run (see :func:`threads_celery.transitions.runs.finish`) and tells the
agent's ``on_stop`` hooks. Each publishes the outbox rows it recorded right after its commit.
"""

from __future__ import annotations

from threads_celery.definitions.agents import AgentRegistry
from threads_celery.definitions.hooks import Stop
from threads_celery.definitions.tools import Tool
from threads_celery.records import CallRow, Run
from threads_celery.runtime import batches, hooks
from threads_celery.runtime.ports import Worker
from threads_celery.transitions import runs


def step_queue(registry: AgentRegistry, agent_name: str) -> str | None:
    """The queue of the agent's steps (None: the default work queue)."""
    return registry.get(agent_name).queue if agent_name in registry else None


def commit_call(
    worker: Worker,
    run: Run,
    fence: int,
    call: CallRow,
    tool: Tool | None,
    content: str,
    *,
    is_error: bool,
    own_outbox: bool = True,
    fails_run: str | None = None,
    kind: str | None = None,
) -> str:
    """Commit ``call``'s result on the run's ``fence`` and publish what runs next; returns what
    happened (``fails_run``: a failure no model can fix, which ends the run in error)."""
    if call.batch is not None:
        # A concurrent call's siblings may still run: its result is recorded on the call (and
        # a failure no model can fix ends the run, as a cancel would).
        limit = worker.settings.max_parallel_tool_calls
        return batches.record_concurrent_result(
            worker, run, call, content, is_error=is_error, limit=limit, fails_run=fails_run
        )
    outcome, entries = runs.commit_call_result(
        worker.store,
        run,
        call,
        fence=fence,
        content=content,
        is_error=is_error,
        ends_turn=tool is not None and tool.ends_turn,
        own_outbox=own_outbox,
        step_queue=step_queue(worker.registry, run.agent),
        now=worker.clock(),
        fails_run=fails_run,
        kind=kind,
        gives_output=tool is not None and tool.gives_output,
    )
    worker.publish(entries)
    return outcome


def finish_run(
    worker: Worker, run: Run, fence: int, status: str, *, output: str | None = None, error: str | None = None
) -> None:
    """End the run ``status`` on its ``fence``, publish what follows, and tell the agent's
    ``on_stop`` hooks."""
    with worker.store.transaction() as tx:
        entries = runs.finish(tx, run, fence=fence, status=status, now=worker.clock(), output=output, error=error)
    worker.publish(entries)
    if run.agent in worker.registry:
        hooks.observe_stop(worker.registry.get(run.agent), run, run.step, Stop(status, output, error))
