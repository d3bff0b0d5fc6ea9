"""Hooks: deciding, context and observing hook points, each cut off at its time limit.

Pure first (the chain's verdict, what a deciding hook may return), then the time limit, then
runs on the embedded runtime: a denied call shows the model ``denied: <reason>`` and never runs;
changed arguments are validated again and recorded; a failing or hanging deciding hook denies,
a failing context hook stops the step, a failing observing hook is ignored; a hook's Allow does
not loosen the permissions; the subagent hook points gate and observe child runs.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.agent_tool_agents import eventually, unique
from threads_celery import Agent, ConfigError, Threads, agent_tool, tool
from threads_celery.definitions.hooks import (
    Allow,
    Deny,
    Failed,
    HookCall,
    HookContext,
    HookResult,
    Modify,
    Stop,
    Verdict,
    check_answer,
    combine,
)
from threads_celery.runtime.hooks import call_with_limit, implementers
from threads_celery.testing import ScriptedModel, call, say

pytestmark = pytest.mark.embedded(concurrency=3)

WAIT_S = 30.0
ARGS = {"city": "Paris"}


# -- the chain's verdict (pure) ----------------------------------------------------------------


def test_no_answers_or_only_allows_let_the_call_through_unchanged() -> None:
    assert combine(ARGS, []) == Verdict(True, args=ARGS)
    assert combine(ARGS, [None, Allow(), Allow("fine")]) == Verdict(True, args=ARGS)


def test_a_deny_wins_over_everything_before_it() -> None:
    verdict = combine(ARGS, [Allow(), Modify({"city": "Rome"}), Deny("not today")])
    assert (verdict.allowed, verdict.reason) == (False, "not today")


def test_the_first_deny_stops_the_chain() -> None:
    assert combine(ARGS, [Deny("first"), Deny("second")]).reason == "first"


def test_modify_hands_its_arguments_on_and_the_last_change_counts() -> None:
    verdict = combine(ARGS, [Modify({"city": "Rome"}), None, Modify({"city": "Oslo"})])
    assert verdict == Verdict(True, args={"city": "Oslo"}, changed=True)


def test_a_failed_hook_fails_closed_naming_the_hook() -> None:
    verdict = combine(ARGS, [Allow(), Failed("before_tool", "RuntimeError: boom")])
    assert not verdict.allowed and "before_tool" in verdict.reason and "boom" in verdict.reason


def test_an_empty_deny_reason_still_says_why() -> None:
    assert combine(ARGS, [Deny("")]).reason == "denied by a hook"


@pytest.mark.parametrize("value", [True, "allow", {"city": "Rome"}, 0, Modify(["not", "a", "mapping"])])  # type: ignore[arg-type]
def test_anything_but_allow_deny_modify_or_none_is_a_failure(value: Any) -> None:
    assert isinstance(check_answer("before_tool", value), Failed)


@pytest.mark.parametrize("value", [None, Allow(), Deny("x"), Modify({"a": 1})])
def test_the_answers_a_deciding_hook_may_give(value: Any) -> None:
    assert check_answer("before_tool", value) == value


# -- the time limit ------------------------------------------------------------------------------


def test_a_hook_that_returns_in_time_gives_its_value() -> None:
    assert call_with_limit("before_tool", lambda x: x * 2, (21,), 5.0) == ("ok", 42)


def test_a_hook_that_raises_is_a_failure_with_the_reason() -> None:
    def boom() -> None:
        raise ValueError("bad hook")

    status, failed = call_with_limit("after_tool", boom, (), 5.0)
    assert status == "failed" and failed.reason == "ValueError: bad hook"


def test_a_hook_that_hangs_is_cut_at_its_limit() -> None:
    release = threading.Event()
    try:
        status, failed = call_with_limit("before_step", lambda: release.wait(WAIT_S), (), 0.05)
    finally:
        release.set()
    assert status == "failed" and failed.reason == "timed out after 0.05 s"


def test_an_async_hook_is_awaited() -> None:
    async def hook(x: int) -> int:
        return x + 1

    assert call_with_limit("before_tool", hook, (1,), 5.0) == ("ok", 2)


# -- definitions ---------------------------------------------------------------------------------


class CityIn(BaseModel):
    city: str


def test_only_overridden_hook_methods_and_hook_objects_run_in_order() -> None:
    class Own(Agent):
        def before_tool(self, call: Any, ctx: Any) -> Any:
            return None

    class Extra:
        def before_tool(self, call: Any, ctx: Any) -> Any:
            return None

    plain = Agent(name=unique("plain"), instructions="", model=ScriptedModel([say("x")]))
    assert implementers(plain, "before_tool") == []
    extra = Extra()
    agent = Own(name=unique("own"), instructions="", model=ScriptedModel([say("x")]), hooks=[extra])
    assert [getattr(f, "__self__", None) for f in implementers(agent, "before_tool")] == [
        agent,
        extra,
    ]


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_hook_time_limit_that_is_not_a_positive_number_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="hook_timeout_s"):
        Agent(name=unique("a"), instructions="", model=ScriptedModel([say("x")]), hook_timeout_s=bad)


def test_a_hooks_entry_with_no_hook_method_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="defines none of the hook methods"):
        Agent(name=unique("a"), instructions="", model=ScriptedModel([say("x")]), hooks=[object()])


# -- on the embedded runtime ---------------------------------------------------------------------


class Weather:
    """A read_only tool that records the arguments it ran with."""

    def __init__(self, effect: str = "read_only") -> None:
        self.ran: list[str] = []
        self.tool = tool(
            name="get_weather",
            description="Weather.",
            input=CityIn,
            effect=effect,
            execute=self.execute,
        )

    def execute(self, inp: CityIn, ctx: Any) -> str:
        self.ran.append(inp.city)
        return f"sunny in {inp.city}"


class HookedAgent(Agent):
    """An agent whose before_tool answer and other hooks are set per test."""

    answer: Any = None
    seen: list[Any]

    def __init__(
        self,
        weather: Weather,
        *,
        answer: Any = None,
        script: list[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.answer = answer
        self.seen = []
        super().__init__(
            name=unique("hooked"),
            instructions="Be brief.",
            model=ScriptedModel(script or [call("get_weather", city="Paris"), say("done")]),
            tools=[weather.tool],
            **kwargs,
        )

    def before_tool(self, call: HookCall, ctx: HookContext) -> Any:
        self.seen.append(("before_tool", call.name, dict(call.args), ctx.run_id))
        answer = self.answer
        return answer() if callable(answer) and not isinstance(answer, (Allow, Deny, Modify)) else answer


def _run(threads: Threads, agent: Agent) -> tuple[Any, list[Any]]:
    handle = threads.start(agent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    return run, [m for m in threads.messages(handle.thread_id) if m.role == "tool"]


def _call_row(threads: Threads, run_id: str) -> Any:
    with threads.store.read() as tx:
        return tx.calls_in_step(run_id, 0)[0]


def test_a_denied_call_never_runs_and_the_model_sees_denied_with_the_reason(
    threads: Threads,
) -> None:
    weather = Weather()
    agent = HookedAgent(weather, answer=Deny("weather is off limits"))
    run, [result] = _run(threads, agent)
    assert run.status == "completed"
    assert (result.tool_result.content, result.tool_result.is_error) == (
        "denied: weather is off limits",
        True,
    )
    assert weather.ran == []
    assert agent.seen == [("before_tool", "get_weather", {"city": "Paris"}, run.id)]


def test_an_allowed_call_runs_as_asked(threads: Threads) -> None:
    weather = Weather()
    run, [result] = _run(threads, HookedAgent(weather, answer=Allow()))
    assert (run.status, result.tool_result.content, weather.ran) == (
        "completed",
        "sunny in Paris",
        ["Paris"],
    )


def test_changed_arguments_are_validated_again_recorded_and_used(threads: Threads) -> None:
    weather = Weather()
    run, [result] = _run(threads, HookedAgent(weather, answer=Modify({"city": "Rome"})))
    assert (run.status, result.tool_result.content, weather.ran) == (
        "completed",
        "sunny in Rome",
        ["Rome"],
    )
    row = _call_row(threads, run.id)
    assert (json.loads(row.args), json.loads(row.original_args)) == (
        {"city": "Rome"},
        {"city": "Paris"},
    )


def test_changed_arguments_that_fail_validation_are_the_calls_error_and_it_never_runs(
    threads: Threads,
) -> None:
    weather = Weather()
    run, [result] = _run(threads, HookedAgent(weather, answer=Modify({"town": "Rome"})))
    assert run.status == "completed" and result.tool_result.is_error
    assert "before_tool hook changed the arguments to ones that fail validation" in result.tool_result.content
    assert weather.ran == []


def _raise() -> Any:
    raise RuntimeError("policy service down")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (_raise, "RuntimeError: policy service down"),
        (lambda: "yes please", "not str"),
        (lambda: Modify("city=Rome"), "needs a mapping"),  # type: ignore[arg-type]
    ],
    ids=["raises", "bad-return", "bad-modify"],
)
def test_a_failing_deciding_hook_fails_closed(threads: Threads, answer: Any, reason: str) -> None:
    weather = Weather()
    run, [result] = _run(threads, HookedAgent(weather, answer=answer))
    assert run.status == "completed" and weather.ran == []
    content = result.tool_result.content
    assert content.startswith("denied: hook before_tool failed") and reason in content


def test_a_hanging_deciding_hook_is_cut_at_its_limit_and_denies(threads: Threads) -> None:
    release = threading.Event()
    weather = Weather()
    agent = HookedAgent(weather, answer=lambda: release.wait(WAIT_S), hook_timeout_s=0.2)
    try:
        run, [result] = _run(threads, agent)
    finally:
        release.set()
    assert run.status == "completed" and weather.ran == []
    assert "timed out after 0.2 s" in result.tool_result.content


class Counter:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0

    def before_tool(self, call: HookCall, ctx: HookContext) -> Any:
        self.calls += 1
        return self.answer


def test_several_deciding_hooks_the_first_deny_stops_the_chain(threads: Threads) -> None:
    weather = Weather()
    first, second = Counter(Deny("first says no")), Counter(Allow())
    agent = HookedAgent(weather, answer=Modify({"city": "Rome"}), hooks=[first, second])
    run, [result] = _run(threads, agent)
    assert run.status == "completed" and result.tool_result.content == "denied: first says no"
    assert (first.calls, second.calls, weather.ran) == (1, 0, [])


def test_a_later_hook_sees_the_arguments_an_earlier_one_changed(threads: Threads) -> None:
    weather = Weather()
    seen: list[dict[str, Any]] = []

    class Looker:
        def before_tool(self, call: HookCall, ctx: HookContext) -> Any:
            seen.append(dict(call.args))
            return Allow()

    run, [result] = _run(threads, HookedAgent(weather, answer=Modify({"city": "Rome"}), hooks=[Looker()]))
    assert run.status == "completed" and result.tool_result.content == "sunny in Rome"
    assert seen == [{"city": "Rome"}] and weather.ran == ["Rome"]


def test_a_hooks_allow_does_not_loosen_the_permissions(threads: Threads) -> None:
    weather = Weather(effect="unguarded")
    agent = HookedAgent(weather, answer=Allow("hook says fine"))
    handle = threads.start(agent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "awaiting_approval" and weather.ran == []
    threads.cancel(handle.run_id)


class ContextAgent(Agent):
    def __init__(self, context: Any, **kwargs: Any) -> None:
        self.context = context
        self.prompts: list[str] = []
        self.stops: list[Stop] = []
        self.results: list[tuple[str, HookResult]] = []
        super().__init__(
            name=unique("ctx"),
            instructions="Base rules.",
            model=ScriptedModel([self._answer]),
            **kwargs,
        )

    def _answer(self, messages: list[Any]) -> str:
        from pydantic_ai.messages import ModelRequest, SystemPromptPart

        self.prompts.extend(
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, SystemPromptPart)
        )
        return "answered"

    def before_step(self, ctx: HookContext) -> Any:
        return self.context() if callable(self.context) else self.context

    def on_stop(self, stop: Stop, ctx: HookContext) -> None:
        self.stops.append(stop)


def test_a_context_hook_adds_to_the_steps_instructions(threads: Threads) -> None:
    agent = ContextAgent("Today is Tuesday.")
    run, _ = _run(threads, agent)
    assert run.status == "completed"
    assert agent.prompts == ["Base rules.\n\nToday is Tuesday."]


@pytest.mark.parametrize(
    ("context", "reason"),
    [(_raise, "RuntimeError: policy service down"), (lambda: 42, "not int")],
    ids=["raises", "bad-return"],
)
def test_a_failing_context_hook_stops_the_step_and_the_run_says_why(
    threads: Threads, context: Any, reason: str
) -> None:
    agent = ContextAgent(context)
    run, _ = _run(threads, agent)
    assert run.status == "error" and "hook before_step failed" in (run.error or "") and reason in (run.error or "")
    assert agent.prompts == []  # the model was never asked


def test_a_hanging_context_hook_is_cut_at_its_limit_and_stops_the_step(threads: Threads) -> None:
    release = threading.Event()
    agent = ContextAgent(lambda: release.wait(WAIT_S), hook_timeout_s=0.2)
    try:
        run, _ = _run(threads, agent)
    finally:
        release.set()
    assert run.status == "error" and "timed out after 0.2 s" in (run.error or "")
    assert agent.prompts == []


def test_on_stop_sees_how_the_run_ended(threads: Threads) -> None:
    agent = ContextAgent(None)
    run, _ = _run(threads, agent)
    assert run.status == "completed"
    eventually(lambda: agent.stops, what="on_stop")
    assert agent.stops == [Stop("completed", output="answered")]


class Observer(Agent):
    def __init__(self, weather: Weather, *, fail: bool = False) -> None:
        self.fail = fail
        self.observed: list[tuple[str, HookResult]] = []
        super().__init__(
            name=unique("observer"),
            instructions="",
            model=ScriptedModel([call("get_weather", city="Oslo"), say("done")]),
            tools=[weather.tool],
        )

    def after_tool(self, call: HookCall, result: HookResult, ctx: HookContext) -> None:
        self.observed.append((call.name, result))
        if self.fail:
            raise RuntimeError("observer broke")

    def on_stop(self, stop: Stop, ctx: HookContext) -> None:
        if self.fail:
            raise RuntimeError("observer broke again")


def test_after_tool_sees_the_recorded_result(threads: Threads) -> None:
    observer = Observer(Weather())
    run, _ = _run(threads, observer)
    assert run.status == "completed"
    assert observer.observed == [("get_weather", HookResult("sunny in Oslo", False))]


class HangingObserver(Agent):
    """An agent whose after_tool hook hangs until the test releases it."""

    def __init__(self, weather: Weather, release: threading.Event) -> None:
        self.release = release
        super().__init__(
            name=unique("hanging_observer"),
            instructions="",
            model=ScriptedModel([call("get_weather", city="Lima"), say("done")]),
            tools=[weather.tool],
            hook_timeout_s=0.2,
        )

    def after_tool(self, call: HookCall, result: HookResult, ctx: HookContext) -> None:
        self.release.wait(WAIT_S)


def test_a_hanging_observing_hook_is_cut_at_its_limit_and_the_run_goes_on(
    threads: Threads, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    weather = Weather()
    try:
        with caplog.at_level("WARNING", logger="threads_celery.runtime.hooks"):
            run, [result] = _run(threads, HangingObserver(weather, release))
            # The hook runs after the result is recorded, so the run may end before it is cut.
            eventually(
                lambda: "observing hook after_tool failed and was ignored: timed out after 0.2 s" in caplog.text,
                what="the hung observing hook cut at its limit",
            )
    finally:
        release.set()
    assert run.status == "completed" and result.tool_result.content == "sunny in Lima"


def test_a_failing_observing_hook_is_logged_and_ignored(threads: Threads, caplog: pytest.LogCaptureFixture) -> None:
    weather = Weather()
    observer = Observer(weather, fail=True)
    with caplog.at_level("WARNING", logger="threads_celery.runtime.hooks"):
        run, [result] = _run(threads, observer)
        eventually(lambda: "observer broke again" in caplog.text, what="the on_stop failure logged")
    assert run.status == "completed" and result.tool_result.content == "sunny in Oslo"
    assert "observing hook after_tool failed and was ignored: RuntimeError: observer broke" in caplog.text


class Gatekeeper(Agent):
    """A parent whose before_subagent hook decides whether its child may start."""

    def __init__(self, child: Agent, answer: Any) -> None:
        self.answer = answer
        self.children_seen: list[tuple[str, str]] = []
        super().__init__(
            name=unique("gatekeeper"),
            instructions="",
            model=ScriptedModel([call("helper", message="help"), say("done")]),
            tools=[agent_tool(child, "Help.", name="helper")],
        )

    def before_subagent(self, call: HookCall, ctx: HookContext) -> Any:
        return self.answer

    def after_subagent(self, run: Any, result: Any) -> None:
        self.children_seen.append((run.agent_type, result.status))


def test_before_subagent_can_deny_a_child_run_which_then_never_starts(threads: Threads) -> None:
    child = Agent(name=unique("helper"), instructions="", model=ScriptedModel([say("helped")]))
    parent = Gatekeeper(child, Deny("no children today"))
    handle = threads.start(parent, "go")
    run = threads.wait(handle.run_id, WAIT_S)
    [result] = [m.tool_result for m in threads.messages(handle.thread_id) if m.role == "tool"]
    assert run.status == "completed" and result.content == "denied: no children today"
    assert threads.agent_tool_runs(handle.thread_id) == []


def test_after_subagent_observes_the_childs_result(threads: Threads) -> None:
    child = Agent(name=unique("helper"), instructions="", model=ScriptedModel([say("helped")]))
    parent = Gatekeeper(child, Allow())
    handle = threads.start(parent, "go")
    assert threads.wait(handle.run_id, WAIT_S).status == "completed"
    assert parent.children_seen == [(child.name, "completed")]
