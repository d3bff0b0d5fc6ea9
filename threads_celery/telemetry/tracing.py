"""OpenTelemetry traces: one trace per run, however many workers and Celery hops it crossed.

Task messages carry ids only, so the trace context travels through the ledger instead: when a run
is created, a ``threads.run`` span (``threads.child_run`` for an agent-tool child) is recorded
under the creator's current context (an HTTP request, a parent's tool call, nothing), and its W3C
``traceparent`` is stored on the run. Every worker that later runs a model step or a tool call of
that run reads it and opens ``threads.step`` or ``threads.tool`` as its child, so a run is one
trace, and a child run nests under the tool call that started it. Pydantic AI's own spans (an
``InstrumentedModel``, or ``Agent.instrument_all()``) open inside ``threads.step``, since the
model is called while that span is current.

Tracing costs nothing until an OpenTelemetry SDK tracer provider is set (``pip install
'threads-celery[otel]'`` and configure it as usual); without one, no span is recorded and no
traceparent stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

TRACER_NAME = "threads_celery"


def _tracer() -> Any | None:
    try:
        from opentelemetry import trace  # optional: threads-celery[otel]; untraced without it
    except ImportError:
        return None
    return trace.get_tracer(TRACER_NAME)


def start_run_span(run_id: str, thread_id: str, agent: str, *, parent_run_id: str | None = None) -> str | None:
    """Record the run's span under the current context; its ``traceparent``, or None untraced."""
    tracer = _tracer()
    if tracer is None:
        return None
    from opentelemetry.propagate import inject  # optional: threads-celery[otel], found by _tracer()

    name = "threads.child_run" if parent_run_id else "threads.run"
    attributes = {"threads.run_id": run_id, "threads.thread_id": thread_id, "threads.agent": agent}
    if parent_run_id:
        attributes["threads.agent_tool_run_id"] = parent_run_id
    with tracer.start_as_current_span(f"{name} {agent}", attributes=attributes) as span:
        if not span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def run_child_span(traceparent: str | None, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A span under the run's stored context (a step, a tool call); a no-op when untraced."""
    tracer = _tracer()
    if tracer is None or traceparent is None:
        yield None
        return
    # optional: threads-celery[otel], found by _tracer()
    from opentelemetry.propagate import extract
    from opentelemetry.trace import Status, StatusCode

    parent = extract({"traceparent": traceparent})
    with tracer.start_as_current_span(name, context=parent, attributes=attributes, record_exception=False) as span:
        try:
            yield span
        except Exception as exc:
            # A retry or a fence lost is control flow, not a failure of the span's work.
            if type(exc).__name__ not in ("RetryLater", "FenceLost"):
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def step_span(traceparent: str | None, *, run_id: str, step: int, agent: str) -> Any:
    """``threads.step``: one model step of a run."""
    if traceparent is None:  # an untraced run (no SDK when it was created): nothing to look up
        return nullcontext()
    return run_child_span(
        traceparent,
        f"threads.step {agent}",
        {"threads.run_id": run_id, "threads.step": step, "threads.agent": agent},
    )


def tool_span(traceparent: str | None, *, run_id: str, effect_key: str, tool: str, effect: str) -> Any:
    """``threads.tool``: one tool call of a run."""
    if traceparent is None:
        return nullcontext()
    return run_child_span(
        traceparent,
        f"threads.tool {tool}",
        {
            "threads.run_id": run_id,
            "threads.effect_key": effect_key,
            "threads.tool": tool,
            "threads.effect": effect,
        },
    )


__all__ = ["TRACER_NAME", "run_child_span", "start_run_span", "step_span", "tool_span"]
