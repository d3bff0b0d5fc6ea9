"""Runs end to end on the embedded runtime: SQLite and the in-process Celery worker, no services.

One embedded runtime serves the whole module (starting and stopping a worker costs seconds);
each test defines its own agent under a unique name and works on its own threads. Tools run on
the worker's threads in this process, so they report to the test through plain lists and
``threading.Event``s. Model retries are off (``model_retries=0``) so a failing model ends its
run at once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import task_postrun
from pydantic import BaseModel

from threads_celery import Agent, Settings, Threads, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.exceptions import RunNotFound, RunTimeout
from threads_celery.records import Message, Run
from threads_celery.testing import Reply, ScriptedModel, call, calls, say

WAIT_S = 30.0
_names = itertools.count()


class Gate:
    """A tool that blocks until the test opens the gate, and tells the test when it is inside."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0

    def execute(self, inp: Any, ctx: Any) -> str:
        self.calls += 1
        self.entered.set()
        if not self.opened.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return f"passed the gate ({inp.label})"

    def wait_inside(self) -> None:
        assert self.entered.wait(WAIT_S), "the tool never started"


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.opened.set()  # never leave a worker thread blocked after a test


class Label(BaseModel):
    label: str = ""


class City(BaseModel):
    city: str


class Item(BaseModel):
    item: str


class Count(BaseModel):
    n: int


def unique(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


def make_agent(script: list[Any], tools: list[Any], *, name: str = "agent", **options: Any) -> Agent:
    # These tests are about the step machine, not approvals: every tool runs without asking.
    options.setdefault("permissions", Permissions.allow_all())
    return Agent(
        name=unique(name),
        instructions="You are a test agent.",
        model=ScriptedModel(script),
        tools=tools,
        **options,
    )


def run_to_end(threads: Threads, agent: Agent, message: str = "hello", **options: Any) -> tuple[Run, list[Message]]:
    handle = threads.start(agent, message, **options)
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    return run, threads.messages(handle.thread_id)


def shape(messages: list[Message]) -> list[tuple[str, str]]:
    """Each message as (role, what it says): text, the tools called, or the tool result."""
    out = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            out.append(("assistant", m.text + "|" + ",".join(c.name for c in m.tool_calls)))
        elif m.role == "tool":
            assert m.tool_result is not None
            flag = "ERROR " if m.tool_result.is_error else ""
            out.append(("tool", f"{m.tool_result.name}: {flag}{m.tool_result.content}"))
        else:
            out.append((m.role, m.text))
    return out


def assert_results_answer_calls(messages: list[Message]) -> None:
    """Every tool result answers the calls of the assistant message before it, in order."""
    expected: list[str] = []
    for m in messages:
        if m.role == "assistant":
            assert not expected, f"calls {expected} were never answered"
            expected = [c.id for c in m.tool_calls]
        elif m.role == "tool":
            assert m.tool_result is not None
            assert expected, f"tool result {m.tool_result} answers no call"
            assert m.tool_result.call_id == expected.pop(0)
    assert [m.seq for m in messages] == list(range(len(messages)))


# -- runs of 1, 3 and 20 steps -------------------------------------------------------------------


def test_a_one_step_run_answers_in_text(threads: Threads) -> None:
    agent = make_agent([say("Hello! How can I help?")], [])
    run, messages = run_to_end(threads, agent, "hi")
    assert run.status == "completed"
    assert run.output == "Hello! How can I help?"
    assert run.error is None
    assert run.step == 1
    assert shape(messages) == [("user", "hi"), ("assistant", "Hello! How can I help?")]
    assert all(m.run_id == run.id for m in messages)


def test_a_three_step_run_calls_tools_and_answers(threads: Threads) -> None:
    weather = tool(
        name="get_weather",
        description="Weather.",
        input=City,
        effect="read_only",
        execute=lambda inp, ctx: {"city": inp.city, "temperature": 21},
    )
    clock = tool(name="get_time", description="Time.", input=City, execute=lambda inp, ctx: f"noon in {inp.city}")
    agent = make_agent(
        [call("get_weather", city="Paris"), call("get_time", city="Oslo"), say("21 degrees, and noon.")],
        [weather, clock],
    )
    run, messages = run_to_end(threads, agent, "weather and time?")
    assert run.status == "completed"
    assert run.output == "21 degrees, and noon."
    assert shape(messages) == [
        ("user", "weather and time?"),
        ("assistant", "|get_weather"),
        ("tool", 'get_weather: {"city":"Paris","temperature":21}'),
        ("assistant", "|get_time"),
        ("tool", "get_time: noon in Oslo"),
        ("assistant", "21 degrees, and noon."),
    ]
    assert_results_answer_calls(messages)
    assert messages[1].tool_calls[0].args == '{"city": "Paris"}'


def test_a_twenty_step_run_has_stable_unique_effect_keys(threads: Threads) -> None:
    seen: list[tuple[int, str, int]] = []

    def count(inp: Count, ctx: Any) -> str:
        seen.append((inp.n, ctx.effect_key, ctx.attempt))
        return f"counted {inp.n}"

    counter = tool(name="count", description="Count.", input=Count, execute=count)
    agent = make_agent([call("count", n=i) for i in range(19)] + [say("counted to 18")], [counter])
    run, messages = run_to_end(threads, agent, "count")

    assert run.status == "completed", run.error
    assert run.output == "counted to 18"
    expected: list[tuple[str, str]] = [("user", "count")]
    for i in range(19):
        expected += [("assistant", "|count"), ("tool", f"count: counted {i}")]
    expected.append(("assistant", "counted to 18"))
    assert shape(messages) == expected
    assert_results_answer_calls(messages)

    # Each call ran once, in order, under the key ``run:step:index``; the ledger shows the same keys.
    keys = [f"{run.id}:{step}:0" for step in range(19)]
    assert seen == [(i, keys[i], 1) for i in range(19)]
    ledger_keys = [c.effect_key for m in messages for c in m.tool_calls]
    assert ledger_keys == keys
    assert len(set(keys)) == 19


# -- calls of one reply ------------------------------------------------------------------------------


def test_the_calls_of_one_reply_run_one_after_another_in_order(threads: Threads) -> None:
    events: list[str] = []

    def append(inp: Item, ctx: Any) -> str:
        events.append(f"start {inp.item}")
        time.sleep(0.02)  # widen the window in which a parallel call would interleave
        events.append(f"end {inp.item}")
        return f"appended {inp.item} as {ctx.effect_key.rsplit(':', 1)[1]}"

    appender = tool(name="append", description="Append.", input=Item, execute=append)
    agent = make_agent(
        [calls(("append", {"item": "a"}), ("append", {"item": "b"}), ("append", {"item": "c"})), say("done")],
        [appender],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    assert events == ["start a", "end a", "start b", "end b", "start c", "end c"]
    assert shape(messages) == [
        ("user", "hello"),
        ("assistant", "|append,append,append"),
        ("tool", "append: appended a as 0"),
        ("tool", "append: appended b as 1"),
        ("tool", "append: appended c as 2"),
        ("assistant", "done"),
    ]
    assert_results_answer_calls(messages)
    assert [c.effect_key for c in messages[1].tool_calls] == [f"{run.id}:0:{i}" for i in range(3)]


def test_sync_and_async_tools_both_run(threads: Threads) -> None:
    async def fetch(inp: City, ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"city": inp.city, "source": "async"}

    def lookup(inp: City, ctx: Any) -> str:
        return f"{inp.city} (sync)"

    agent = make_agent(
        [calls(("fetch", {"city": "Rome"}), ("lookup", {"city": "Lima"})), say("both")],
        [
            tool(name="fetch", description="Async.", input=City, effect="read_only", execute=fetch),
            tool(name="lookup", description="Sync.", input=City, effect="read_only", execute=lookup),
        ],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    assert shape(messages)[2:4] == [
        ("tool", 'fetch: {"city":"Rome","source":"async"}'),
        ("tool", "lookup: Lima (sync)"),
    ]


# -- what the model sees when a call goes wrong -------------------------------------------------------


class SeenByModel:
    """A script entry that records the tool results the model was shown, then answers."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.results: list[tuple[str, str]] = []

    def __call__(self, messages: list[Any]) -> str:
        from pydantic_ai.messages import ModelRequest, ToolReturnPart

        self.results = [
            (part.tool_name, str(part.content))
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        return self.answer


def test_a_tool_that_raises_is_an_error_result_and_the_run_goes_on(threads: Threads) -> None:
    def explode(inp: City, ctx: Any) -> str:
        raise ValueError(f"{inp.city} is closed today")

    seen = SeenByModel("Sorry, Paris is closed.")
    agent = make_agent(
        [call("visit", city="Paris"), seen],
        [tool(name="visit", description="Visit.", input=City, execute=explode)],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    assert run.output == "Sorry, Paris is closed."
    result = messages[2].tool_result
    assert result is not None
    assert result.is_error is True
    assert result.content == "ValueError: Paris is closed today"
    assert seen.results == [("visit", "ValueError: Paris is closed today")]


def test_a_schema_error_never_calls_the_tool_and_the_model_sees_it(threads: Threads) -> None:
    invoked = []
    seen = SeenByModel("I need a city.")
    agent = make_agent(
        [call("get_weather", town="Paris"), seen],
        [
            tool(
                name="get_weather",
                description="Weather.",
                input=City,
                execute=lambda inp, ctx: invoked.append(inp) or "sunny",
            )
        ],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    assert invoked == []
    result = messages[2].tool_result
    assert result is not None and result.is_error
    assert "invalid arguments" in result.content
    assert "city: Field required" in result.content
    assert "town: Extra inputs are not permitted" in result.content
    assert seen.results == [("get_weather", result.content)]


def test_unparseable_json_arguments_never_call_the_tool(threads: Threads) -> None:
    invoked = []
    seen = SeenByModel("Let me fix that.")
    agent = make_agent(
        [call("get_weather", '{"city": "Par'), seen],
        [
            tool(
                name="get_weather",
                description="Weather.",
                input=City,
                execute=lambda inp, ctx: invoked.append(inp) or "sunny",
            )
        ],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    assert invoked == []
    assert messages[1].tool_calls[0].args == '{"city": "Par'
    result = messages[2].tool_result
    assert result is not None and result.is_error
    assert result.content.startswith("the arguments are not valid JSON")
    assert seen.results == [("get_weather", result.content)]


def test_an_unknown_tool_is_an_error_result_naming_the_tools(threads: Threads) -> None:
    seen = SeenByModel("I will use the right tool.")
    agent = make_agent(
        [call("get_wether", city="Paris"), seen],
        [tool(name="get_weather", description="Weather.", input=City, execute=lambda inp, ctx: "sunny")],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    result = messages[2].tool_result
    assert result is not None and result.is_error
    assert result.content == "unknown tool 'get_wether'; the tools you can call are: get_weather"
    assert seen.results == [("get_wether", result.content)]


def test_a_result_that_fails_the_output_model_is_shown_as_an_error(threads: Threads) -> None:
    class Forecast(BaseModel):
        city: str
        temperature: float

    seen = SeenByModel("The forecast service misbehaved.")
    agent = make_agent(
        [call("forecast", city="Paris"), seen],
        [
            tool(
                name="forecast",
                description="Forecast.",
                input=City,
                output=Forecast,
                execute=lambda inp, ctx: {"city": inp.city, "temperature": "warm"},
            )
        ],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    result = messages[2].tool_result
    assert result is not None and result.is_error
    assert result.content.startswith("tool 'forecast' returned a result that fails its output schema")
    assert "temperature" in result.content


# -- ends_turn ---------------------------------------------------------------------------------------


def test_an_ends_turn_tool_completes_the_run_without_another_model_call(threads: Threads) -> None:
    booked = []
    agent = make_agent(
        # One turn only: a second model call would raise ScriptExhausted and fail the run.
        [Reply(text="Booking it now.", calls=(("book", '{"item": "room 12"}'),))],
        [
            tool(
                name="book",
                description="Book.",
                input=Item,
                ends_turn=True,
                execute=lambda inp, ctx: booked.append(inp.item) or "booked",
            )
        ],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed", run.error
    assert run.output == "Booking it now."
    assert booked == ["room 12"]
    assert shape(messages) == [("user", "hello"), ("assistant", "Booking it now.|book"), ("tool", "book: booked")]


def test_calls_after_an_ends_turn_call_are_skipped(threads: Threads) -> None:
    appended = []
    agent = make_agent(
        [Reply(text="Done here.", calls=(("book", '{"item": "x"}'), ("append", '{"item": "y"}')))],
        [
            tool(name="book", description="Book.", input=Item, ends_turn=True, execute=lambda inp, ctx: "booked"),
            tool(name="append", description="Append.", input=Item, execute=lambda inp, ctx: appended.append(inp)),
        ],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed", run.error
    assert run.output == "Done here."
    assert appended == []
    assert shape(messages)[2:] == [("tool", "book: booked"), ("tool", "append: ERROR skipped: book ended the turn")]
    assert_results_answer_calls(messages)


def test_an_ends_turn_tool_that_fails_gives_the_turn_back_to_the_model(threads: Threads) -> None:
    def fail(inp: Item, ctx: Any) -> str:
        raise RuntimeError("no rooms left")

    agent = make_agent(
        [call("book", item="room 12"), say("No rooms left, sorry.")],
        [tool(name="book", description="Book.", input=Item, ends_turn=True, execute=fail)],
    )
    run, messages = run_to_end(threads, agent)
    assert run.status == "completed"
    assert run.output == "No rooms left, sorry."
    assert shape(messages)[-2:] == [
        ("tool", "book: ERROR RuntimeError: no rooms left"),
        ("assistant", "No rooms left, sorry."),
    ]


# -- one run at a time per thread ----------------------------------------------------------------


def test_a_second_message_on_a_busy_thread_is_queued_not_interleaved(threads: Threads, gate: Gate) -> None:
    agent = make_agent(
        [call("hold", label="x"), say("finished")],
        [tool(name="hold", description="Hold.", input=Label, execute=gate.execute)],
    )
    first = threads.start(agent, "first message")
    gate.wait_inside()
    second = threads.start(agent, "second message", thread_id=first.thread_id)

    assert second.thread_id == first.thread_id
    assert second.status == "queued"
    assert threads.get_run(second.run_id).status == "queued"
    assert threads.get_run(first.run_id).status == "running"
    assert "second message" not in [m.text for m in threads.messages(first.thread_id)]

    gate.opened.set()
    run_a = threads.wait(first.run_id, timeout=WAIT_S)
    run_b = threads.wait(second.run_id, timeout=WAIT_S)
    assert (run_a.status, run_b.status) == ("completed", "completed")

    messages = threads.messages(first.thread_id)
    assert [(m.run_id, *s) for m, s in zip(messages, shape(messages), strict=True)] == [
        (run_a.id, "user", "first message"),
        (run_a.id, "assistant", "|hold"),
        (run_a.id, "tool", "hold: passed the gate (x)"),
        (run_a.id, "assistant", "finished"),
        (run_b.id, "user", "second message"),
        (run_b.id, "assistant", "|hold"),
        (run_b.id, "tool", "hold: passed the gate (x)"),
        (run_b.id, "assistant", "finished"),
    ]
    assert_results_answer_calls(messages)


def test_cancelling_a_queued_run_skips_it(threads: Threads, gate: Gate) -> None:
    agent = make_agent(
        [call("hold", label="x"), say("finished")],
        [tool(name="hold", description="Hold.", input=Label, execute=gate.execute)],
    )
    first = threads.start(agent, "first")
    gate.wait_inside()
    queued = threads.start(agent, "never runs", thread_id=first.thread_id)

    cancelled = threads.cancel(queued.run_id, reason="changed my mind")
    assert cancelled.status == "aborted"
    assert cancelled.error == "changed my mind"
    assert threads.get_run(first.run_id).status == "running"

    gate.opened.set()
    assert threads.wait(first.run_id, timeout=WAIT_S).status == "completed"
    assert gate.calls == 1
    assert threads.get_run(queued.run_id).status == "aborted"
    assert "never runs" not in [m.text for m in threads.messages(first.thread_id)]

    # The thread is free again: the next message runs at once.
    third = threads.start(agent, "third", thread_id=first.thread_id)
    assert threads.wait(third.run_id, timeout=WAIT_S).status == "completed"
    assert [m.text for m in threads.messages(first.thread_id) if m.role == "user"] == ["first", "third"]


def test_cancelling_a_running_run_refuses_its_late_result(threads: Threads, gate: Gate) -> None:
    agent = make_agent(
        [call("hold", label="x"), say("finished")],
        [tool(name="hold", description="Hold.", input=Label, execute=gate.execute)],
    )
    handle = threads.start(agent, "start")
    gate.wait_inside()
    effect_key = f"{handle.run_id}:0:0"

    finished = threading.Event()

    def on_postrun(args: Any = None, **_: Any) -> None:
        if list(args or ()) == [effect_key]:  # the call's task (its id adds a token of the publish)
            finished.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        cancelled = threads.cancel(handle.run_id)
        assert cancelled.status == "aborted"
        assert threads.wait(handle.run_id, timeout=1).status == "aborted"
        gate.opened.set()
        assert finished.wait(WAIT_S), "the tool task never finished"
    finally:
        task_postrun.disconnect(on_postrun)

    # The tool returned after the cancel: its result was refused, the run stays aborted.
    run = threads.get_run(handle.run_id)
    assert run.status == "aborted"
    assert run.output is None
    assert shape(threads.messages(handle.thread_id)) == [("user", "start"), ("assistant", "|hold")]

    # Cancelling an ended run leaves it as it is.
    assert threads.cancel(handle.run_id).status == "aborted"

    # The thread was released: a new message runs.
    after = threads.start(agent, "again", thread_id=handle.thread_id)
    assert threads.wait(after.run_id, timeout=WAIT_S).status == "completed"


def test_a_completed_run_is_not_changed_by_cancel(threads: Threads) -> None:
    agent = make_agent([say("done")], [])
    run, _ = run_to_end(threads, agent)
    assert threads.cancel(run.id).status == "completed"
    assert threads.get_run(run.id).output == "done"


# -- failures -------------------------------------------------------------------------------------


def test_a_model_that_raises_ends_the_run_in_error_with_a_clear_message(threads: Threads) -> None:
    def broken(messages: list[Any]) -> str:
        raise RuntimeError("provider exploded")

    agent = make_agent([broken], [])
    run, messages = run_to_end(threads, agent, "hi")
    assert run.status == "error"
    assert run.output is None
    assert run.error is not None
    assert "model step 0 failed" in run.error
    assert "RuntimeError: provider exploded" in run.error
    assert shape(messages) == [("user", "hi")]
    # The failed run released its thread: the next message runs (and fails the same way)
    # instead of waiting forever behind it.
    again = threads.start(agent, "again", thread_id=run.thread_id)
    assert threads.wait(again.run_id, timeout=WAIT_S).status == "error"


def test_a_model_that_asks_for_more_turns_than_scripted_fails_the_run(threads: Threads) -> None:
    agent = make_agent(
        [call("noop")], [tool(name="noop", description="Nothing.", input=Label, execute=lambda i, c: "ok")]
    )
    run, _ = run_to_end(threads, agent)
    assert run.status == "error"
    assert "ScriptExhausted" in (run.error or "")


def test_a_run_that_reaches_its_step_limit_ends_in_error(threads: Threads) -> None:
    noop = tool(name="noop", description="Nothing.", input=Label, execute=lambda inp, ctx: "ok")
    agent = make_agent([call("noop")] * 5 + [say("never")], [noop], max_steps=3)
    run, messages = run_to_end(threads, agent)
    assert run.status == "error"
    assert run.error == "the run reached its limit of 3 model steps"
    assert [m.role for m in messages].count("assistant") == 3


def test_get_run_of_an_unknown_id_is_run_not_found(threads: Threads) -> None:
    with pytest.raises(RunNotFound) as info:
        threads.get_run("run_does_not_exist")
    assert info.value.run_id == "run_does_not_exist"
    assert "run_does_not_exist" in str(info.value)
    with pytest.raises(RunNotFound):
        threads.wait("run_does_not_exist", timeout=1)
    with pytest.raises(RunNotFound):
        threads.cancel("run_does_not_exist")


def test_wait_gives_up_with_run_timeout(threads: Threads, gate: Gate) -> None:
    agent = make_agent(
        [call("hold", label="x"), say("finished")],
        [tool(name="hold", description="Hold.", input=Label, execute=gate.execute)],
    )
    handle = threads.start(agent, "slow")
    gate.wait_inside()
    with pytest.raises(RunTimeout) as info:
        threads.wait(handle.run_id, timeout=0.2)
    assert info.value.run_id == handle.run_id
    assert info.value.status == "running"
    assert handle.run_id in str(info.value)
    assert isinstance(info.value, TimeoutError)
    gate.opened.set()
    assert threads.wait(handle.run_id, timeout=WAIT_S).status == "completed"


def test_two_threads_run_at_the_same_time(threads: Threads) -> None:
    # Two gates that each wait for the other: only runs that truly overlap can both pass.
    inside = [threading.Event(), threading.Event()]

    def meet(inp: Count, ctx: Any) -> str:
        inside[inp.n].set()
        if not inside[1 - inp.n].wait(WAIT_S):
            raise TimeoutError("the other run never arrived")
        return "met"

    agent = make_agent(
        [lambda messages: call("meet", n=int(_last_user_text(messages))), say("done")],
        [tool(name="meet", description="Meet.", input=Count, execute=meet)],
    )
    try:
        a = threads.start(agent, "0")
        b = threads.start(agent, "1")
        assert a.thread_id != b.thread_id
        runs = [threads.wait(h.run_id, timeout=WAIT_S) for h in (a, b)]
    finally:
        for event in inside:
            event.set()
    assert [r.status for r in runs] == ["completed", "completed"]
    for handle in (a, b):
        assert shape(threads.messages(handle.thread_id))[2] == ("tool", "meet: met")


def _last_user_text(messages: list[Any]) -> str:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    return str(part.content)
    raise AssertionError("no user message")


def test_a_failing_model_is_retried_then_the_run_fails_or_recovers() -> None:
    # A runtime of its own: model steps are retried once (after a one-second backoff).
    flaky_calls: list[int] = []
    broken_calls: list[int] = []

    def flaky(messages: list[Any]) -> str:
        flaky_calls.append(1)
        if len(flaky_calls) == 1:
            raise ConnectionError("provider hiccup")
        return "recovered"

    def broken(messages: list[Any]) -> str:
        broken_calls.append(1)
        raise ConnectionError("provider is down")

    with Threads.embedded(settings=Settings(model_retries=1)) as runtime:
        recovers = runtime.start(make_agent([flaky], []), "hi")
        fails = runtime.start(make_agent([broken], []), "hi")
        recovered = runtime.wait(recovers.run_id, timeout=WAIT_S)
        failed = runtime.wait(fails.run_id, timeout=WAIT_S)

    assert (recovered.status, recovered.output) == ("completed", "recovered")
    assert len(flaky_calls) == 2
    assert failed.status == "error"
    assert failed.error == "model step 0 failed after 2 attempts: ConnectionError: provider is down"
    assert len(broken_calls) == 2


def test_a_model_error_the_provider_will_repeat_is_not_retried() -> None:
    from threads_celery.settings import Settings

    class Refused(Exception):
        status_code = 404

    attempts: list[int] = []

    def refuse(messages):
        attempts.append(1)
        raise Refused("model not found")

    agent = Agent(name="refused-model", instructions="x", model=ScriptedModel([refuse]))
    with Threads.embedded(settings=Settings(model_retries=3), reconcile_interval=None) as threads:
        run = threads.wait(threads.start(agent, "hi").run_id, 20)
    assert run.status == "error" and "model not found" in (run.error or "")
    assert len(attempts) == 1
