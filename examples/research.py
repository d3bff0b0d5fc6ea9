"""Agents as tools, offline: a coordinator delegates research to child runs and imports in the background.

    threads-celery run examples/research.py:agent "Compare HTTP/3 and gRPC" --approve

What it shows:

- ``research`` is an agent tool, ``agent_tool(Researcher, ...)``: each call is a child run of the
  ``researcher`` agent on a thread of its own, and the coordinator's model gets its summary as the
  call's result. The model asks for both topics in one reply. Calls of one reply run in order,
  each awaited, so the two children run one after the other; no worker is held while one runs
  (the child's end writes the parent's result and enqueues its next task).
- ``start_import`` is an ordinary tool that starts a *detached* child with
  ``ctx.run_agent_tool(Importer, ..., detached=Detached(on_finish="import_finished",
  on_milestones=["halfway"]))``. It returns the handle at once; the import runs in the
  background while the research goes on, reports progress (a fraction over about three
  seconds, with a phase and a message) and milestones, narrates "halfway" into the coordinator's
  thread, and its end is delivered to the coordinator's ``import_finished`` method, which writes
  ``.threads-celery/imports/<run>.json``. The child's run id is derived from the call's effect
  key, so a retried call re-attaches to the import instead of starting a second one; that is
  why the tool is ``idempotent``, and why, under the default permissions, it asks for approval
  (``--approve`` gives it).
- The researchers' ``read_sources`` tool reports progress too, and a ``sources_read`` milestone.

``threads-celery run`` draws a progress bar for every child run, with its phase and its
milestones; embedded, it also waits for the background import (its worker stops when the
command exits). Every model is a :class:`~threads_celery.testing.ScriptedModel`: no network and
no API key. With PostgreSQL and a broker, start the worker with the whole module, so that it
knows the background agent as well: ``threads-celery worker --agents examples/research.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ToolReturnPart,
    UserPromptPart,
)

from threads_celery import (
    Agent,
    AgentToolFailure,
    AgentToolResult,
    AgentToolRun,
    Detached,
    Permissions,
    ToolContext,
    agent_tool,
    tool,
)
from threads_celery.testing import Reply, ScriptedModel

IMPORTS = Path(".threads-celery") / "imports"
#: Seconds between progress reports: above the 200 ms coalescing window, so each one is shown.
STEP_S = 0.25


# -- reading the conversation (what a scripted model looks at) ----------------------------------


def _user_text(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _results(messages: list[ModelMessage], name: str) -> list[Any]:
    """Every result of tool ``name`` since the last user message, oldest first (JSON decoded)."""
    found: list[Any] = []
    for message in reversed(messages):
        if not isinstance(message, ModelRequest):
            continue
        if any(isinstance(p, UserPromptPart) for p in message.parts):
            break
        for part in message.parts:
            if isinstance(part, ToolReturnPart) and part.tool_name == name:
                content = part.content
                try:
                    found.append(json.loads(content) if isinstance(content, str) else content)
                except json.JSONDecodeError:
                    found.append(content)
    return list(reversed(found))


def topics_of(text: str) -> list[str]:
    """The two things to compare in "Compare X and Y" (X vs Y, X with Y); HTTP/3 and gRPC by default."""
    match = re.search(r"(?:compare\s+)?(.+?)\s+(?:and|vs\.?|versus|with)\s+(.+)", text.strip(), re.IGNORECASE)
    if not match:
        return ["HTTP/3", "gRPC"]
    first = re.sub(r"^compare\s+", "", match.group(1), flags=re.IGNORECASE)
    return [t.strip(" .?!\"'") or "?" for t in (first, match.group(2))]


# -- the researcher: an agent the coordinator calls as a tool ------------------------------------

NOTES = {
    "http/3": ["runs over QUIC, on UDP", "no head-of-line blocking between streams", "0-RTT connection resumption"],
    "grpc": ["RPC framework on HTTP/2", "schemas and code generation from Protocol Buffers", "four streaming modes"],
}


class SourcesIn(BaseModel):
    topic: str = Field(description="What to read up on")


def _read_sources(inp: SourcesIn, ctx: ToolContext) -> dict[str, Any]:
    sources = 4
    for done in range(1, sources + 1):
        time.sleep(STEP_S)  # stands for fetching and reading one source
        ctx.report_progress(fraction=done / sources, phase="reading", message=f"source {done}/{sources}")
    ctx.report_progress(milestone="sources_read", data={"sources": sources})
    notes = NOTES.get(inp.topic.lower(), ["no notes in the offline corpus"])
    return {"topic": inp.topic, "sources": sources, "notes": notes}


read_sources = tool(
    name="read_sources",
    description="Read the sources on a topic and return notes.",
    input=SourcesIn,
    effect="read_only",
    execute=_read_sources,
)


def _research(messages: list[ModelMessage]) -> Reply | str:
    read = _results(messages, "read_sources")
    if not read:
        topic = _user_text(messages).removeprefix("Research ").strip() or "HTTP/3"
        return Reply(text=f"Reading up on {topic}.", calls=(("read_sources", json.dumps({"topic": topic})),))
    found = read[-1] if isinstance(read[-1], dict) else {"topic": "?", "notes": [str(read[-1])]}
    return f"{found['topic']}: " + "; ".join(found["notes"]) + "."


class Researcher(Agent):
    """Reads up on one topic and answers with a one-line summary."""

    name = "researcher"
    instructions = "Research the topic you are given and answer with a short summary of the key facts."
    model = ScriptedModel([_research] * 4, model_name="research-script")
    tools = (read_sources,)

    def format_agent_tool_input(self, value: Any) -> str:
        """The child's first message, from the ``research`` call's arguments."""
        return f"Research {value['topic']}" if isinstance(value, dict) and "topic" in value else str(value)


class ResearchIn(BaseModel):
    topic: str = Field(description="One topic to research, e.g. HTTP/3")


research = agent_tool(
    Researcher,
    "Research one topic in a separate agent run; returns a summary.",
    display_name="researcher",
    input=ResearchIn,
    name="research",
)


# -- the importer: an agent started in the background by a tool ---------------------------------


class ImportIn(BaseModel):
    dataset: str = Field(description="The dataset to import")


def _import_records(inp: ImportIn, ctx: ToolContext) -> dict[str, Any]:
    batches, per_batch = 12, 100
    for done in range(1, batches + 1):
        time.sleep(STEP_S)  # stands for writing one batch
        ctx.report_progress(fraction=done / batches, phase="importing", message=f"batch {done}/{batches}")
        if done == batches // 2:
            ctx.report_progress(milestone="halfway", data={"records": done * per_batch})
    ctx.report_progress(milestone="indexed", data={"records": batches * per_batch})
    # ctx.effect_key would be the idempotency key of a real bulk-load API.
    load_id = "LOAD-" + hashlib.sha256(ctx.effect_key.encode()).hexdigest()[:8].upper()
    return {"dataset": inp.dataset, "records": batches * per_batch, "load_id": load_id}


import_records = tool(
    name="import_records",
    description="Import a dataset in batches.",
    input=ImportIn,
    effect="idempotent",
    dedup_window_ms=24 * 60 * 60 * 1000,
    execute=_import_records,
)


def _import(messages: list[ModelMessage]) -> Reply | str:
    done = _results(messages, "import_records")
    if not done:
        dataset = _user_text(messages).removeprefix("Import ").strip() or "protocol-benchmarks"
        return Reply(calls=(("import_records", json.dumps({"dataset": dataset})),))
    result = done[-1]
    if not isinstance(result, dict):
        return f"The import failed: {result}"
    return f"Imported {result['records']} records of {result['dataset']} ({result['load_id']})."


importer = Agent(
    name="importer",
    instructions="Import the dataset you are given.",
    model=ScriptedModel([_import] * 3, model_name="import-script"),
    tools=[import_records],
    # Nobody watches a background run to approve its calls: this one import is allowed up front.
    permissions=Permissions(allow=["import_records"]),
)


class StartImportIn(BaseModel):
    dataset: str = Field(description="The dataset to import in the background")


def _start_import(inp: StartImportIn, ctx: ToolContext) -> dict[str, Any]:
    handle = ctx.run_agent_tool(
        importer,
        f"Import {inp.dataset}",
        detached=Detached(on_finish="import_finished", on_milestones=["halfway"]),
        display_name="import",
    )
    return {"run_id": handle.run_id, "status": handle.status, "dataset": inp.dataset}


start_import = tool(
    name="start_import",
    description="Start importing a dataset in the background; returns the import's run id at once.",
    input=StartImportIn,
    effect="idempotent",
    dedup_window_ms=24 * 60 * 60 * 1000,
    execute=_start_import,
)


# -- the coordinator -----------------------------------------------------------------------------


def _coordinate(messages: list[ModelMessage]) -> Reply | str:
    """Decides from what the conversation holds, so narrated milestones never shift the script."""
    topics = topics_of(_user_text(messages))
    started = _results(messages, "start_import")
    if not started:
        return Reply(
            text="I'll start importing the benchmark data in the background, then research both.",
            calls=(("start_import", json.dumps({"dataset": "protocol-benchmarks"})),),
        )
    found = _results(messages, "research")
    if not found:
        return Reply(
            text=f"Researching {topics[0]} and {topics[1]}.",
            calls=tuple(("research", json.dumps({"topic": t})) for t in topics),
        )
    handle = started[-1]
    import_line = (
        f"The benchmark import runs in the background as {handle['run_id']}."
        if isinstance(handle, dict)
        else f"The import did not start ({handle})."
    )
    summaries = [f"- {s}" if isinstance(s, str) else f"- {json.dumps(s)}" for s in found]
    return f"{topics[0]} vs {topics[1]}:\n" + "\n".join(summaries) + f"\n{import_line}"


class Coordinator(Agent):
    """Plans the work, delegates research to child runs and starts the import in the background."""

    name = "research-coordinator"
    instructions = "Start the benchmark import, research each topic with the research tool, then compare."
    model = ScriptedModel([_coordinate] * 8, model_name="coordinator-script")
    tools = (research, start_import)
    # A child run is capped by its parent's permissions: the background import's own allow rule
    # counts only if the coordinator allows the tool too.
    permissions = Permissions(allow=["import_records"])

    def import_finished(self, run: AgentToolRun, result: AgentToolResult | AgentToolFailure) -> None:
        """``on_finish`` of the background import. Delivered at least once: writing the same file again is harmless."""
        IMPORTS.mkdir(parents=True, exist_ok=True)
        record = {
            "run_id": run.run_id,
            "status": result.status,
            "summary": result.summary if isinstance(result, AgentToolResult) else None,
            "error": result.error if isinstance(result, AgentToolFailure) else None,
        }
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", run.run_id)
        (IMPORTS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


agent = Coordinator()

__all__ = ["Coordinator", "Researcher", "agent", "importer", "research", "start_import", "topics_of"]
