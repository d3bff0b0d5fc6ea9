"""A run is one trace across real worker processes: a prefork worker on Redis runs the model
steps and the tool call of a run started in this process, and every span it records is a child
of the run's span, whose context the run carries in the ledger (task messages carry ids only)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is in the test extra")
from opentelemetry import trace

from tests.support.processes import REPO_ROOT, ManagedProcess
from tests.support.waiting import Deadline

READY_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 60.0

AGENTS = """
import json, os
from pydantic import BaseModel
from threads_celery import Agent, tool
from threads_celery.testing import ScriptedModel, call, say

if os.environ.get("SPANS_FILE"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def export(self, spans):
            with open(os.environ["SPANS_FILE"], "a") as out:
                for span in spans:
                    out.write(json.dumps({
                        "name": span.name, "trace_id": format(span.context.trace_id, "032x"),
                        "span_id": format(span.context.span_id, "016x"),
                        "parent": format(span.parent.span_id, "016x") if span.parent else None,
                        "pid": os.getpid(),
                    }) + "\\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


class EchoIn(BaseModel):
    text: str


echo = tool(name="echo", description="Echo.", input=EchoIn, effect="read_only", execute=lambda inp, ctx: inp.text)
fleet = Agent(name="traced-fleet", instructions="Echo.", model=ScriptedModel([call("echo", text="hi"), say("done")]), tools=[echo])
"""


def _ensure_a_tracer_provider() -> None:
    """This process records the run's span (any SDK provider will do; one may be set already)."""
    from opentelemetry.sdk.trace import TracerProvider

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())


def test_a_runs_spans_in_the_workers_are_children_of_the_runs_span(
    tmp_path: Path, migrated_pg_url: str, integration_redis_url: str
) -> None:
    (tmp_path / "traced_agents.py").write_text(AGENTS)
    spans_file = tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADS_", "CELERY_"))}
    env.update(
        THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=integration_redis_url,
        THREADS_AGENTS="traced_agents", SPANS_FILE=str(spans_file),
        PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{tmp_path}", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "prefork", "-c", "2",
            "-l", "INFO", "-n", "traced@%h", "--without-mingle", "--without-gossip"]  # fmt: skip
    worker = ManagedProcess("the traced worker", argv, env=env, log_path=tmp_path / "worker.log", cwd=tmp_path).start()
    sys.path.insert(0, str(tmp_path))
    try:
        ready = Deadline(READY_TIMEOUT_S)
        worker.wait_for_log("traced@", timeout=ready.remaining())
        worker.wait_for_log(r" ready\.", timeout=ready.remaining())
        import traced_agents

        from threads_celery import Threads

        _ensure_a_tracer_provider()
        with Threads(database_url=migrated_pg_url, broker_url=integration_redis_url) as threads:
            threads.register(traced_agents.fleet)
            run = threads.wait(threads.start("traced-fleet", "go").run_id, timeout=RUN_TIMEOUT_S)
        assert run.status == "completed", worker.log_text()[-3000:]
        assert run.traceparent is not None
        _, trace_id, run_span_id, _ = run.traceparent.split("-")
        spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
        names = sorted(s["name"] for s in spans)
        assert names == ["threads.step traced-fleet", "threads.step traced-fleet", "threads.tool echo"], names
        assert {s["trace_id"] for s in spans} == {trace_id}
        assert {s["parent"] for s in spans} == {run_span_id}
        assert os.getpid() not in {s["pid"] for s in spans}  # recorded by the worker's processes
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("traced_agents", None)
        worker.terminate(timeout=20)
