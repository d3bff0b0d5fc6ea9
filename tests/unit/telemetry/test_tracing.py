"""OpenTelemetry traces, recorded with the SDK's in-memory exporter: a run is one trace across its
Celery hops (model steps and tool calls run as separate tasks, the context travels in the ledger),
a child run nests under the tool call that started it, and Pydantic AI's own model spans nest
inside the step that made the call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from threads_celery import Agent, Threads, agent_tool, tool
from threads_celery.testing import ScriptedModel, call, say

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is in the test extra")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

RUN_TIMEOUT_S = 30.0
_exporter = InMemorySpanExporter()
_provider: Any = None
_recording = False


class _WhileRecording(SimpleSpanProcessor):
    """Exports only while a test of this module runs: the provider stays for the whole session
    (it cannot be replaced), and later tests must not fill the exporter."""

    def on_end(self, span: Any) -> None:
        if _recording:
            super().on_end(span)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry refuses to replace it), cleared."""
    global _provider, _recording
    if _provider is None:
        # One SDK provider per process: another test module may have set it first (the
        # cross-worker trace test does); record through it rather than fail to replace it.
        current = trace.get_tracer_provider()
        if isinstance(current, sdk.TracerProvider):
            _provider = current
        else:
            _provider = sdk.TracerProvider()
            trace.set_tracer_provider(_provider)
        _provider.add_span_processor(_WhileRecording(_exporter))
    assert trace.get_tracer_provider() is _provider, "another tracer provider was set in this process"
    _exporter.clear()
    _recording = True
    try:
        yield _exporter
    finally:
        _recording = False
        _exporter.clear()


class EchoIn(BaseModel):
    text: str


echo = tool(
    name="echo",
    description="Echo.",
    input=EchoIn,
    effect="read_only",
    execute=lambda inp, ctx: inp.text,
)


def _instrumented(model: Any) -> Any:
    from pydantic_ai.models.instrumented import InstrumentationSettings, InstrumentedModel

    return InstrumentedModel(model, InstrumentationSettings(tracer_provider=_provider))


def by_name(finished: Any, prefix: str) -> list[Any]:
    return [s for s in finished if s.name.startswith(prefix)]


def test_a_run_is_one_trace_with_steps_and_tools_under_its_span(
    spans: InMemorySpanExporter,
) -> None:
    model = _instrumented(ScriptedModel([call("echo", text="hi"), say("done")]))
    agent = Agent(name="traced", instructions="Echo.", model=model, tools=[echo])
    with Threads.embedded() as threads:
        threads.register(agent)
        run = threads.wait(threads.start("traced", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert run.status == "completed", run
    finished = spans.get_finished_spans()
    [run_span] = by_name(finished, "threads.run traced")
    steps = by_name(finished, "threads.step traced")
    [tool_span] = by_name(finished, "threads.tool echo")
    assert len(steps) == 2
    trace_id = run_span.context.trace_id
    assert run_span.parent is None  # started with nothing current: the run's trace starts here
    for span in (*steps, tool_span):
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == run_span.context.span_id
    assert run_span.attributes["threads.run_id"] == run.id
    assert tool_span.attributes["threads.effect_key"].startswith(run.id)
    # Pydantic AI's own spans, one per model request, each inside the step that made it.
    model_spans = [s for s in finished if s.name.startswith("chat")]
    assert len(model_spans) == 2
    step_ids = {s.context.span_id for s in steps}
    assert all(s.parent is not None and s.parent.span_id in step_ids for s in model_spans)


def test_a_run_started_inside_a_span_joins_the_callers_trace(spans: InMemorySpanExporter) -> None:
    agent = Agent(name="joined", instructions="Answer.", model=ScriptedModel([say("ok")]))
    tracer = trace.get_tracer("the-web-app")
    with Threads.embedded() as threads:
        threads.register(agent)
        with tracer.start_as_current_span("POST /checkout") as request:
            handle = threads.start("joined", "go")
        threads.wait(handle.run_id, timeout=RUN_TIMEOUT_S)
    [run_span] = by_name(spans.get_finished_spans(), "threads.run joined")
    [step] = by_name(spans.get_finished_spans(), "threads.step joined")
    assert run_span.parent is not None and run_span.parent.span_id == request.get_span_context().span_id
    assert step.context.trace_id == request.get_span_context().trace_id


def test_a_child_run_nests_under_the_tool_call_that_started_it(spans: InMemorySpanExporter) -> None:
    child = Agent(name="traced_child", instructions="Summarise.", model=ScriptedModel([say("summary")]))
    parent = Agent(
        name="traced-parent",
        instructions="Delegate.",
        model=ScriptedModel([call("traced_child", message="please"), say("done")]),
        tools=[agent_tool(child, "Summarise things.")],
    )
    with Threads.embedded() as threads:
        threads.register(child)
        threads.register(parent)
        run = threads.wait(threads.start("traced-parent", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert run.status == "completed", run
        results = [m.tool_result for m in threads.messages(run.thread_id) if m.tool_result is not None]
        assert [r.is_error for r in results] == [False] and "summary" in results[0].content
    finished = spans.get_finished_spans()
    [parent_span] = by_name(finished, "threads.run traced-parent")
    [child_span] = by_name(finished, "threads.child_run traced_child")
    [child_step] = by_name(finished, "threads.step traced_child")
    tool_spans = by_name(finished, "threads.tool traced_child")
    assert tool_spans, [s.name for s in finished]
    trace_id = parent_span.context.trace_id
    assert {s.context.trace_id for s in (child_span, child_step, *tool_spans)} == {trace_id}
    assert child_span.parent is not None and child_span.parent.span_id in {s.context.span_id for s in tool_spans}
    assert child_step.parent is not None and child_step.parent.span_id == child_span.context.span_id
