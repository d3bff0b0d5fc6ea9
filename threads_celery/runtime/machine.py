"""The step machine: what ``threads.step`` and ``threads.tool`` do.

Each task loads the ledger, asks a pure decision function what to do, and applies the answer in
one transaction that also records the next task (an outbox row). The outbox is published right
after commit. Every write a worker makes is conditional on the run's fence, so a worker whose
lease moved on has its late writes refused (:class:`~threads_celery.exceptions.FenceLost`).

Commits per tool call: one for a read_only tool (its rerun is safe, so no claim is recorded
before it runs), two for every other effect (the claim is the evidence that the effect may have
happened).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, assert_never

from pydantic_ai.exceptions import ModelRetry

from threads_celery.decisions.effects import NeedsLookup, Park, RecordFound, RunAgain
from threads_celery.decisions.next_step import (  # Busy, Proceed, Skip, decide_*: re-exported
    Busy,
    Proceed,
    Skip,
    decide_call,
    decide_step,
)
from threads_celery.decisions.permissions import Ask, Deny
from threads_celery.decisions.provider_limits import provider_of
from threads_celery.decisions.retry import model_retries, retried_in_last_reply
from threads_celery.decisions.usage import LIMIT_REASON, limit_reached
from threads_celery.definitions.agents import Agent, AgentRegistry
from threads_celery.definitions.context import ToolContext
from threads_celery.definitions.hooks import Failed, Stop
from threads_celery.definitions.model_strings import check_model_usable
from threads_celery.definitions.tools import Tool, ToolArgumentsError, ToolOutputError, render_result, result_kind
from threads_celery.definitions.variables import declared
from threads_celery.exceptions import (
    AgentCodeFailed,
    ConfigError,
    EffectUnknown,
    FenceLost,
    RetryLater,
    SecretUndecryptable,
    StoreUnavailable,
    UnknownAgent,
)
from threads_celery.records import CallRow, Run, UsageTotals
from threads_celery.redaction import install_log_redaction, redact_text, redact_value, redacting, secrets_active
from threads_celery.runtime import (
    batches,
    child_runs,
    delivery,
    deploys,
    failures,
    hooks,
    live_stream,
    models,
    pauses,
    provider_retry,
    recovery,
    result_commit,
    step_commit,
    subagents,
    tool_faults,
)
from threads_celery.runtime.history import HistoryCache, MessageSource, Prefetched
from threads_celery.runtime.leases import LeaseKeeper
from threads_celery.runtime.outcomes import commit_call, finish_run
from threads_celery.runtime.permission_checks import check_call
from threads_celery.runtime.ports import Publish
from threads_celery.runtime.progress import ProgressReporter
from threads_celery.runtime.rate_limiter import rate_limiter_for
from threads_celery.runtime.reconcile_lookup import run_lookup
from threads_celery.runtime.streaming import HeldStartedEvents, ToolCallStarted, ToolCallStarts
from threads_celery.runtime.usage_limits import totals_for_limits
from threads_celery.runtime.variables import ThreadEnv, redacted_for_thread
from threads_celery.settings import Settings
from threads_celery.store import Store
from threads_celery.telemetry import metrics, tracing
from threads_celery.transitions import runs
from threads_celery.transitions.agent_tools import child_signal
from threads_celery.transitions.pending import wait_for_a_person

if TYPE_CHECKING:
    from threads_celery.definitions.agent_tools import Detached, DetachedHandle

log = logging.getLogger("threads_celery.runtime.machine")


class _Answering:
    """Whether the provider began to answer a step's request: a part of its reply arrived, or
    the whole of it. A request it answered is billed, even if the attempt fails after."""

    __slots__ = ("_feed", "answered")

    def __init__(self, feed: models.OnStream) -> None:
        self._feed = feed
        self.answered = False

    def feed(self, event: models.StreamEvent) -> None:
        self.answered = True
        self._feed(event)


# -- the machine -----------------------------------------------------------------------------


class Runtime:
    """Advances runs: one model step or one tool call per task."""

    def __init__(
        self,
        store: Store,
        registry: AgentRegistry,
        *,
        publish: Publish,
        settings: Settings | None = None,
        worker_id: str | None = None,
        clock: Callable[[], datetime] = runs.utcnow,
    ) -> None:
        self.store = store
        self.registry = registry
        self.publish = publish
        self.settings = settings or Settings()
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self.keeper = LeaseKeeper()
        self.history = HistoryCache()
        self.rate_limiter = rate_limiter_for(self.settings.rate_limits, self.settings.broker_url)
        self.progress = ProgressReporter(self)
        #: The thread the current task (on this worker thread) works on, nudged when it ends.
        self._touched = threading.local()
        #: The deployment version this worker runs (None: versions are not in use); see
        #: :mod:`.deploys`. Set by the worker's application, from its Celery app.
        self.deploy_version: str | None = None

    # -- model steps -----------------------------------------------------------------------

    def run_step(self, run_id: str, step: int, *, attempt: int = 0) -> str:
        """Carry out model step ``step`` of a run. Returns what happened, for logs and tests."""
        try:
            return self._run_step(run_id, step, attempt=attempt)
        finally:
            self._nudge_touched()

    def _nudge_touched(self) -> None:
        """Nudge the live subscribers of the thread this task worked on: it may have committed."""
        thread_id = getattr(self._touched, "thread_id", None)
        if thread_id is not None:
            self._touched.thread_id = None
            live_stream.nudge(self, thread_id)

    def _run_step(self, run_id: str, step: int, *, attempt: int) -> str:
        now = self.clock()
        lease = timedelta(seconds=self.settings.step_lease_s)
        step_key = runs.step_key(run_id, step)
        # A step that is due is read and claimed at once, its history with it (PostgreSQL: one
        # statement) ...
        ends, versions = self.history.ends_for_run(run_id)
        claimed = self.store.read_and_claim_step(
            run_id, step, step_key, owner=self.worker_id, lease_until=now + lease, now=now,
            history_ends=ends, history_versions=versions,
        )  # fmt: skip
        source: MessageSource = self.store
        if claimed is not None:
            run = claimed.run
            fence = run.fence + 1
            source = Prefetched(self.store, run.thread_id, claimed.history_ends, claimed.messages,
                                versions=claimed.versions, unchanged=claimed.unchanged)  # fmt: skip
        else:
            # ... else read unlocked, decided, then claimed on the fence as read (the claim also
            # checks that no other worker's lease is live): whatever moved in between makes the
            # claim write nothing, and the step is tried again.
            read = self.store.run(run_id)
            decision = decide_step(read, step, now)
            if isinstance(decision, Proceed) and step > 0 and self.store.unsettled_call(run_id, step - 1):
                # Published by a call's result that a crash of PostgreSQL took back: the call
                # runs again from its outbox row, and its result publishes the step again.
                return "skipped: a call of the step before has not settled"
            if isinstance(decision, Skip):
                self.store.delete_outbox(step_key)
                return f"skipped: {decision.reason}"
            if isinstance(decision, Busy):
                raise RetryLater((decision.until - now).total_seconds(), "run is held by another worker")
            assert read is not None
            run = read
            new_fence = self.store.claim_step(run, step_key, owner=self.worker_id, lease_until=now + lease, now=now)
            if new_fence is None:
                raise RetryLater(0.1, "run was claimed concurrently")
            fence = new_fence
        self._touched.thread_id = run.thread_id
        if self.deploy_version is not None and (
            routed := deploys.route_step(self, self.deploy_version, run, fence, step)
        ):
            return routed
        if lost := failures.ended_lost_step(self, run, step):
            return lost
        if run.status == "queued":  # the claim committed the run's "running" event: read it now
            live_stream.nudge(self, run.thread_id)
        history = self.history.load(source, run.thread_id, run_id=run.id)
        if (run.input_meta or {}).get("narrate"):
            # A narrated status line: its message is in the thread already; no model turn.
            line = self.store.run(run.id)  # for its text: the claim left the run's input out
            finish_run(self, run, fence, "completed", output=line.input if line is not None else "")
            return "narrated"
        try:
            agent = self.registry.get(run.agent)
        except UnknownAgent as exc:
            return provider_retry.step_failed(self, run, fence, step, attempt, exc)
        try:
            check_model_usable(agent.model)  # a missing provider package or API key ends the run: no retry fixes it
            agent.preflight()
        except ConfigError as exc:
            finish_run(self, run, fence, "error", error=f"agent {agent.name!r} cannot run in this worker: {exc}")
            return "error: agent cannot run"
        if step >= agent.max_steps:
            finish_run(self, run, fence, "error", error=f"the run reached its limit of {agent.max_steps} model steps")
            return "error: step limit"
        instructions = hooks.step_instructions(run, step, agent)
        if isinstance(instructions, Failed):
            finish_run(self, run, fence, "error", error=hooks.stopped_by(instructions))
            return "error: a before_step hook failed"
        if agent.usage_limits is not None:
            with self.store.read() as tx:
                totals = totals_for_limits(tx, run.id, run.thread_id, agent.name, agent.usage_limits, self.clock())
            reached = limit_reached(totals, agent.usage_limits)
            if reached is not None and reached.on_limit == "ask":
                with self.store.transaction() as tx:
                    parked = tx.advance_run(
                        run.id, fence=fence, now=self.clock(), status="parked", error=reached.message,
                        lease_owner=None, lease_expires_at=None,
                    )  # fmt: skip
                    if parked is None:
                        raise FenceLost(run.id, fence)
                return f"parked: {LIMIT_REASON}"
            if reached is not None:
                finish_run(self, run, fence, "interrupted", error=reached.message)
                return f"interrupted: {LIMIT_REASON}"
        provider = provider_of(agent.model_identity())
        provider_retry.wait_for_window(self, run, fence, provider)
        held = HeldStartedEvents(lambda payloads: self._record_started(run, payloads))
        starts = ToolCallStarts(
            agent.runtime_tools, lambda started: self._tool_call_started(run, step, agent, started, held)
        )
        answering = _Answering(held.feeding(starts.feed))
        feed = answering.feed
        live = live_stream.open_step_stream(self, run, step, fence, agent)
        on_stream = feed if live is None else live_stream.both(feed, live)
        try:
            with (
                tracing.step_span(run.traceparent, run_id=run.id, step=step, agent=agent.name),
                metrics.timed_step(agent.name),
                self.keeper.hold(lambda: self._extend_run_lease(run.id, fence, lease), lease.total_seconds() / 3),
            ):
                turn = models.request_turn(
                    agent.model,
                    instructions,
                    history.messages,
                    agent.runtime_tools,
                    on_stream=on_stream,
                    converted=history.model_history(),
                    run_step=step + 1,
                )
                answering.answered = True
            starts.finish()
            if live is not None:
                live_stream.close(live)
        except AgentCodeFailed as exc:  # not the provider: the agent's own code, which would fail again
            if live is not None:
                live_stream.void(live)
            held.flush()
            finish_run(self, run, fence, "error", error=str(exc))
            return "error: the agent's code failed"
        except Exception as exc:  # noqa: BLE001 - the provider failed: retry with backoff, then fail the run
            if live is not None:
                live_stream.void(live)
            held.flush()
            billed = answering.answered
            ended = provider_retry.provider_failed(self, run, fence, step, exc, billed=billed)
            if ended is not None:
                return ended
            return provider_retry.step_failed(self, run, fence, step, attempt, exc, billed=billed)
        used = int(turn.usage.get("input_tokens", 0)) + int(turn.usage.get("output_tokens", 0))
        self.rate_limiter.spend_tokens(provider, used, self.clock())
        try:
            return step_commit.commit_step(self, run, fence, step, agent, models.bounded_turn(turn), held.payloads)
        except (FenceLost, StoreUnavailable):
            raise
        except Exception as exc:  # noqa: BLE001 - what the model sent could not be stored: ask again, then end the run
            held.flush()
            return provider_retry.step_failed(self, run, fence, step, attempt, exc, billed=True)

    def _tool_call_started(
        self, run: Run, step: int, agent: Agent, started: ToolCallStarted, held: HeldStartedEvents
    ) -> None:
        """Hold ``tool_call_started`` for the thread's log and call the agent's hook (best effort)."""
        held.add(started.payload(run.id, runs.effect_key_for(run.id, step, started.index)))
        hook = getattr(agent, "on_tool_call_started", None)
        if callable(hook):
            try:
                hook(run, started)
            except Exception as exc:  # noqa: BLE001 - an observing hook's failure is logged and ignored
                log.warning("on_tool_call_started failed: %s: %s", type(exc).__name__, exc)

    def _record_started(self, run: Run, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            self.store.append_event(run.thread_id, run.id, "tool_call_started", payload, self.clock())
        live_stream.nudge(self, run.thread_id)

    def _extend_run_lease(self, run_id: str, fence: int, lease: timedelta) -> bool:
        with self.store.transaction() as tx:
            return tx.extend_run_lease(run_id, fence=fence, owner=self.worker_id, lease_until=self.clock() + lease)

    # -- tool calls ------------------------------------------------------------------------

    def run_tool(self, effect_key: str) -> str:
        """Carry out one tool call. Returns what happened, for logs and tests."""
        try:
            return self._run_tool(effect_key)
        finally:
            self._nudge_touched()

    def _run_tool(self, effect_key: str) -> str:
        now = self.clock()
        loaded = self.store.call_and_run(effect_key)
        if loaded is None:
            return "skipped: no such call"
        call, run = loaded
        self._touched.thread_id = run.thread_id
        if self.deploy_version is not None and (routed := deploys.route_call(self, self.deploy_version, run, call)):
            return routed
        if lost := failures.ended_lost_call(self, call):
            return lost
        agent = self.registry.get(run.agent) if run.agent in self.registry else None
        tool = agent.tool_named(call.tool) if agent else None
        decision = decide_call(call, run, now, tool)
        if isinstance(decision, NeedsLookup):
            # decide_call parks a call whose tool is gone or has no lookup, so both are set here.
            assert tool is not None and tool.reconcile is not None
            decision = decide_call(call, run, now, tool, lookup=run_lookup(tool.reconcile, effect_key))
        if isinstance(decision, Skip):
            if run.is_terminal and call.batch is not None:
                # A cancel lets running calls finish and skips the rest of their group.
                with self.store.transaction() as tx:
                    batches.skip_cancelled(tx, call, now, self.settings.max_parallel_tool_calls)
            return f"skipped: {decision.reason}"
        if isinstance(decision, Busy):
            raise RetryLater((decision.until - now).total_seconds(), "run is held by another worker")
        if call.batch is not None and call.batch == call.index and call.index > 0:
            batches.open_group(self, call, self.settings.max_parallel_tool_calls)
        if agent is None:
            raise UnknownAgent(f"agent {run.agent!r} is not loaded in this worker")
        if isinstance(decision, Park):
            return f"parked: {self._park(run, call, decision.reason)}"
        if isinstance(decision, RecordFound):
            return commit_call(self, run, run.fence, call, tool, render_result(decision.value), is_error=False)
        if isinstance(decision, (Proceed, RunAgain)):
            with (
                tracing.tool_span(
                    run.traceparent, run_id=run.id, effect_key=effect_key, tool=call.tool, effect=call.effect
                ),
                metrics.timed_tool(call.tool),
            ):
                return self._execute(run, call, agent, tool, now)
        assert_never(decision)

    def _execute(self, run: Run, call: CallRow, agent: Agent, tool: Tool | None, now: datetime) -> str:
        if tool is None:
            names = ", ".join(t.name for t in agent.runtime_tools) or "none"
            content = f"unknown tool {call.tool!r}; the tools you can call are: {names}"
            return commit_call(self, run, run.fence, call, None, content, is_error=True)
        try:
            parsed = tool.parse_arguments(call.args)
        except ToolArgumentsError as exc:  # the model is asked to fix them, as Pydantic AI asks
            fails_run = tool_faults.retries_exhausted(
                tool, run.id, lambda: self.history.load(self.store, run.thread_id), agent.output_tool_names
            )
            return commit_call(
                self, run, run.fence, call, tool, str(exc), is_error=True, kind="invalid", fails_run=fails_run
            )
        gated = hooks.gate_call(self.store, run, call, agent, tool, parsed)
        if isinstance(gated, hooks.Refused):
            return commit_call(self, run, run.fence, call, tool, gated.content, is_error=True)
        call, parsed = gated.call, gated.parsed
        if tool.subagent_op is not None:
            return subagents.subagent_call(self, run, call, agent, tool, parsed, now)
        if tool.child_agent is not None:
            return child_runs.dispatch_child(self, run, call, tool, parsed, now)
        permission = check_call(self.store, self.registry, run, agent, tool, call)
        if isinstance(permission, Deny):
            return commit_call(self, run, run.fence, call, tool, f"denied: {permission.reason}", is_error=True)
        if isinstance(permission, Ask) and call.batch is not None:
            # Its siblings are running: a concurrent call cannot hold the run for a person.
            reason = f"{permission.reason}, and a concurrent call cannot wait for approval"
            return commit_call(self, run, run.fence, call, tool, f"denied: {reason}", is_error=True)
        if isinstance(permission, Ask):
            self._await_approval(run, call, permission.reason)
            return f"awaiting approval: {permission.reason}"
        env = ThreadEnv(
            self.store,
            self.registry,
            run.thread_id,
            declared([*agent.variables, *tool.variables]),
            owner=f"tool {tool.name!r} or agent {agent.name!r}",
        )
        missing = env.missing_required()
        if missing and call.batch is not None:
            content = f"needs a value for {', '.join(missing)}, which a concurrent call cannot wait for"
            return commit_call(self, run, run.fence, call, tool, content, is_error=True)
        if missing:
            self._await_approval(run, call, f"needs a value for {', '.join(missing)}", status="awaiting_variable")
            return f"awaiting variables: {', '.join(missing)}"
        fence, attempt = run.fence, call.attempt
        read_only = tool.effect == "read_only"
        claim_started = time.monotonic()
        if not read_only:
            # The claim is the evidence that the effect may have happened: commit it first.
            claimed = self._claim_call(run, call, self.clock())  # the lease counts from the claim
            if claimed is None:
                raise RetryLater(0.1, "run was claimed concurrently")
            fence, attempt = claimed, call.attempt + 1

        renewed = [claim_started]  # when the lease last provably held (monotonic)

        def renew() -> bool:
            started = time.monotonic()
            held = self._extend_call_lease(run.id, call.effect_key, fence, read_only, run.agent_tool_run_id)
            if held:
                renewed[0] = started
            return held

        def still_held() -> bool:  # asked on a continue after a stop: no I/O, a signal handler runs it
            return read_only or self._surely_held_since(renewed[0])

        ctx = ToolContext(
            effect_key=call.effect_key,
            run_id=run.id,
            thread_id=run.thread_id,
            attempt=max(attempt, 1),
            deps=agent.deps,
            heartbeat=renew,
            is_cancelled=lambda: self._is_cancelled(run.id),
            env=env.get,
            report=(
                redacting(functools.partial(self.progress.report, run.agent_tool_run_id), env.revealed)
                if run.agent_tool_run_id is not None
                else None
            ),
            settings=self.settings,
            start_child=redacting(functools.partial(self.start_detached_child, run, call), env.revealed),
            model_retries=lambda: model_retries(
                self.history.load(self.store, run.thread_id).messages, run.id, call.tool
            ),
            run_step=call.step + 1,
            retried_in_reply=lambda: retried_in_last_reply(
                self.history.load(self.store, run.thread_id).messages, run.id
            ),
            usage=lambda: self._usage_before(run.id, call.step),
            count_usage=lambda *spent: self._count_call_usage(run, call.step, agent, *spent),
        )
        install_log_redaction()
        # A secret the tool reads is redacted from this process's logs and stdout while it runs,
        # and from its result and error as data (before serialising) and as text (after).
        with self.keeper.hold(renew, self.settings.tool_lease_s / 3), secrets_active(env.revealed):
            if not read_only and not self._claim_still_held(claim_started, renew):
                # Paused between its claim and the call (SIGSTOP, a long GC, a swapped-out
                # process) past half its lease: the backbone may have settled the call and run it
                # elsewhere since, so an effect now could be the second one. Stop before acting.
                log.warning("call %s: lease lapsed before the tool ran; not running it", call.effect_key)
                raise FenceLost(run.id, fence)
            retries_exhausted: str | None = None
            try:
                with pauses.stop_if_paused(still_held):
                    value = (
                        models.run_coroutine(tool.execute(parsed, ctx)) if tool.is_async else tool.execute(parsed, ctx)
                    )
                value = tool.check_output(value)
                content, is_error = render_result(redact_value(value, env.revealed)), False
                kind = result_kind(value)
            except pauses.PausedPastLease:
                if tool.is_async:
                    models.cancel_pending()
                log.warning("call %s: stopped past its lease; the tool was left before it could act", call.effect_key)
                raise FenceLost(run.id, fence) from None
            except ToolOutputError as exc:
                content, is_error, kind = tool_faults.message(exc, env.revealed), True, None
            except ModelRetry as exc:  # the tool asks the model to try again: a retry prompt
                content, is_error, kind = tool_faults.message(exc, env.revealed), True, "retry"
                retries_exhausted = tool_faults.retries_exhausted(
                    tool, run.id, lambda: self.history.load(self.store, run.thread_id), agent.output_tool_names
                )
            except EffectUnknown as exc:
                reason = tool_faults.message(exc, env.revealed)
                if not read_only:  # it may have acted: as after a crash mid-call, a person decides
                    return f"parked: {self._park(run, call, reason, fence=fence)}"
                content, is_error, kind = reason, True, None
            except BaseException as exc:  # the tool failed: the model sees why and the run goes on
                # Anything tool code raises (SystemExit, a BaseException that cannot be
                # unpickled, one whose __str__ raises) is handled here, in the pool process:
                # only the worker's and the runtime's own signals go on up.
                if tool_faults.is_control(exc):
                    raise
                content, is_error, kind = tool_faults.describe(exc, env.revealed), True, None
            if env.revealed:
                content = redact_text(content, env.revealed)
            fails_run = retries_exhausted
            if env.undecryptable:
                # Whatever the tool made of it: a worker whose key cannot open the thread's
                # secrets must not let the model carry on as if the tool had them.
                fails_run = SecretUndecryptable(env.undecryptable[0]).message
                content, is_error, kind = f"{tool.name}: {fails_run}", True, None
            # Still holding the lease: a store outage here must not lose a result that exists
            # only in this process (dropping it turns a blip into a rerun or a park).
            outcome = result_commit.commit_executed(
                self,
                run,
                fence,
                call,
                tool,
                content,
                is_error=is_error,
                own_outbox=read_only,
                fails_run=fails_run,
                kind=kind,
            )
        hooks.observe_result(agent, gated, content, is_error)
        if outcome.startswith("ended the turn"):
            hooks.observe_stop(agent, run, call.step, Stop("completed"))
        elif outcome.startswith("ended the run in error"):
            hooks.observe_stop(agent, run, call.step, Stop("error", None, fails_run))
        return outcome

    def _surely_held_since(self, held_at: float) -> bool:
        """Whether a call's lease, known to hold at ``held_at`` (monotonic), still surely holds:
        less than half the lease has passed since (the backbone fences a call only after its
        lease expired). No I/O."""
        return time.monotonic() - held_at < self.settings.tool_lease_s / 2

    def _claim_still_held(self, claim_started: float, renew: Callable[[], bool]) -> bool:
        """Whether this worker still holds the call it claimed at ``claim_started`` (monotonic).

        Free while less than half the lease has passed since just before the claim commit (the
        backbone fences a call only after its lease expired); past that, one fenced renewal
        decides. The monotonic clock runs on while a process is stopped, so a pause of any kind
        between the claim and the call is caught here, before the tool runs.
        """
        if self._surely_held_since(claim_started):
            return True
        try:
            return renew()
        except StoreUnavailable:
            return False  # cannot prove the claim is still ours: acting could repeat an effect

    def _claim_call(self, run: Run, call: CallRow, now: datetime) -> int | None:
        """Commit the claim of a call (run lease and fence, call started, outbox row consumed):
        the new fence, or None (nothing written) if the run's fence moved."""
        lease_until = now + timedelta(seconds=self.settings.tool_lease_s)
        return self.store.claim_call_and_run(
            run.id, call.effect_key, fence=run.fence, owner=self.worker_id, lease_until=lease_until, now=now
        )

    def start_detached_child(
        self,
        run: Run,
        call: CallRow,
        child: type[Agent] | Agent | str,
        input_value: Any,
        *,
        detached: bool | Detached,
        run_id: str,
        display_name: str | None,
    ) -> DetachedHandle:
        """``ctx.run_agent_tool(...)``: a detached child of the calling tool's thread."""
        return child_runs.start_detached_child(
            self, run, call, child, input_value, detached=detached, run_id=run_id, display_name=display_name
        )

    def _await_approval(self, run: Run, call: CallRow, reason: str, *, status: str = "awaiting_approval") -> None:
        """The run waits for a person (an approval, or a variable's value), holding no worker."""
        reason = redacted_for_thread(self.store, self.registry, run, reason)  # a hook's verdict may quote a secret
        wait_for_a_person(self.store, run, call, reason, status=status, now=self.clock())

    def _park(self, run: Run, call: CallRow, reason: str, *, fence: int | None = None) -> str:
        """Park ``call`` for a person; returns the reason as stored (redacted), for the task's result.

        A reason is built from what a tool, its exception or its reconcile lookup said, and any
        of those may quote a secret of the thread: it is redacted of every secret the agent's
        variables hold on this thread before it is stored, logged or returned.
        """
        reason = redacted_for_thread(self.store, self.registry, run, reason)
        wait_for_a_person(self.store, run, call, reason, status="parked", now=self.clock(), fence=fence)
        log.warning("run %s parked at call %s (%s): %s", run.id, call.effect_key, call.tool, reason)
        return reason

    def _extend_call_lease(
        self, run_id: str, effect_key: str, fence: int, read_only: bool, agent_tool_run_id: str | None = None
    ) -> bool:
        now = self.clock()
        until = now + timedelta(seconds=self.settings.tool_lease_s)
        with self.store.transaction() as tx:
            if read_only:
                tx.touch_outbox(effect_key, now)
            elif not tx.extend_run_lease(run_id, fence=fence, owner=self.worker_id, lease_until=until):
                return False
            else:
                tx.extend_call_lease(effect_key, until)
            if agent_tool_run_id is not None:
                # A child agent-tool run whose tool is alive is not silent: every renewal (and a
                # tool's own heartbeat) resets its no-progress window.
                child_signal(tx, agent_tool_run_id, now)
            return True

    def _usage_before(self, run_id: str, step: int) -> tuple[UsageTotals, int]:
        with self.store.read() as tx:
            return tx.usage_before(run_id, step)

    def _count_call_usage(
        self, run: Run, step: int, agent: Agent, requests: int, input_tokens: int, output_tokens: int
    ) -> None:
        """Count what a call of ``step`` spent on models of its own in the run's usage, at once:
        the provider billed it whether or not the call's result commits."""
        identity = agent.model_identity()
        with self.store.transaction() as tx:
            tx.add_step_usage(
                run_id=run.id, step=step, thread_id=run.thread_id, agent=agent.name, model=identity,
                requests=requests, input_tokens=input_tokens, output_tokens=output_tokens,
                cost=self.settings.model_prices.cost((identity,), input_tokens, output_tokens),
                now=self.clock(),
            )  # fmt: skip

    def _is_cancelled(self, run_id: str) -> bool:
        with self.store.read() as tx:
            run = tx.get_run(run_id)
        return run is None or run.status == "aborted"

    # -- the backbone ----------------------------------------------------------------------

    def reconcile_tick(self, *, limit: int = 500) -> dict[str, int]:
        """One pass of the backbone (``threads.reconcile``, see :mod:`.recovery`)."""
        counts = recovery.reconcile_tick(self, limit=limit)
        if self.deploy_version is not None:
            counts.update({k: v for k, v in deploys.deploy_sweep(self).items() if v})
        return counts

    def deliver(self, run_id: str, status: str) -> str:
        """Deliver an agent-tool run's finish (``threads.deliver``, see :mod:`.delivery`)."""
        return delivery.deliver(self, run_id, status)


__all__ = ["Busy", "Proceed", "Runtime", "Skip", "decide_call", "decide_step"]
