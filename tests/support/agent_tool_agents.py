"""Helpers and agents for the agent-tool tests ("agents as tools").

Two halves:

* Helpers for the embedded tests (``tests/unit/runtime/test_agent_tool*.py``, ``test_progress.py``):
  :func:`eventually` (re-exported from :mod:`tests.support.waiting`), :class:`Gate` (a tool that blocks on a
  ``threading.Event`` until the test opens it) and :class:`CountingScript` (a scripted model
  entry that counts the turns it answers).
* Agents for worker subprocesses (``THREADS_AGENTS=tests.support.agent_tool_agents``), used by
  ``tests/integration/test_agent_tools_workers.py``. Tools there cannot share memory with the
  test, so they talk through files in a directory whose path travels in the user message
  (``"work <dir>"``): ``write_files`` appends a line to ``<dir>/writes.log`` (the side-effect
  counter), ``wait_for_gate`` touches ``<dir>/gate.entered`` and returns once ``<dir>/gate``
  exists.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from tests.support.waiting import eventually  # noqa: F401 - re-exported for the agent-tool tests
from threads_celery import Agent, agent_tool, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import Reply, ScriptedModel, call, say

T = TypeVar("T")
WAIT_S = 30.0


# -- helpers for embedded tests ----------------------------------------------------------------


class Gate:
    """A tool body that blocks until the test opens the gate, and says when it is inside."""

    def __init__(self, name: str = "wait_here", *, before: Callable[[Any], None] | None = None) -> None:
        self.name = name
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.returned = threading.Event()
        self.before = before
        self.calls = 0

    def execute(self, inp: Any, ctx: Any) -> str:
        self.calls += 1
        if self.before is not None:
            self.before(ctx)
        self.entered.set()
        try:
            if not self.opened.wait(WAIT_S):
                raise TimeoutError("the test never opened the gate")
            return "through the gate"
        finally:
            self.returned.set()

    def wait_inside(self, timeout: float = WAIT_S) -> None:
        assert self.entered.wait(timeout), f"the {self.name} tool never started"

    def tool(self) -> Any:
        return tool(
            name=self.name, description="Wait for the gate.", input=NoInput, effect="read_only", execute=self.execute
        )


class NoInput(BaseModel):
    pass


class CountingScript:
    """A callable script entry that counts the model turns it answered."""

    def __init__(self, reply: Reply | str = "ack") -> None:
        self.reply = reply
        self.turns = 0
        self._lock = threading.Lock()

    def __call__(self, messages: list[Any]) -> Reply | str:
        with self._lock:
            self.turns += 1
        return self.reply


_ids = itertools.count()


def unique(base: str) -> str:
    """A name no other test of this process uses (agents are registered per runtime)."""
    return f"{base}_{next(_ids)}"


class RecordingParent(Agent):
    """A parent agent that records its hooks; its model acknowledges every turn it is given.

    ``turns`` counts the model turns answered by the default script; ``finishes`` records the
    global ``on_agent_tool_finish`` hook; ``done`` records ``on_done``, the method detached runs
    name as their ``on_finish``; ``progress`` records ``on_progress``.
    """

    def __init__(self, name: str, *, tools: Any = (), script: list[Any] | None = None) -> None:
        self.turns = CountingScript("ack")
        self.finishes: list[tuple[str, str]] = []
        self.done: list[tuple[str, Any]] = []
        self.progress: list[tuple[str, dict[str, Any]]] = []
        super().__init__(name=name, instructions="", model=ScriptedModel(script or [self.turns]), tools=list(tools))

    def on_agent_tool_finish(self, run: Any, result: Any) -> None:
        self.finishes.append((run.run_id, result.status))

    def on_done(self, run: Any, result: Any) -> None:
        self.done.append((run.run_id, result))

    def on_progress(self, run: Any, progress: dict[str, Any]) -> None:
        self.progress.append((run.run_id, dict(progress)))


def quick_child(text: str = "child done") -> Agent:
    """A child that answers at once."""
    return Agent(name=unique("quick_child"), instructions="", model=ScriptedModel([say(text)]))


def gated_child(gate: Gate, text: str = "child done") -> Agent:
    """A child that calls the gate's tool, then answers ``text``."""
    return Agent(
        name=unique("gated_child"),
        instructions="",
        model=ScriptedModel([call(gate.name), say(text)]),
        tools=[gate.tool()],
    )


def idle_parent(threads: Any, parent: Agent) -> str:
    """A parent thread with one finished turn, so it exists and is idle."""
    handle = threads.start(parent, "hello")
    run = threads.wait(handle.run_id, WAIT_S)
    assert run.status == "completed", run.error
    return handle.thread_id


def agent_tool_events(threads: Any, thread_id: str, run_id: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The parent thread's ``agent_tool.*`` events (of one run, if given), in order."""
    return [
        (e.type, e.payload)
        for e in threads.events(thread_id)
        if e.type.startswith("agent_tool.") and (run_id is None or e.payload.get("run_id") == run_id)
    ]


def runs_of(threads: Any, agent: Agent) -> list[Any]:
    """Every run of ``agent`` (a child's runs: how many children were started)."""
    return [r for r in threads.runs(limit=1000) if r.agent == agent.name]


def delivered(threads: Any, run_id: str, status: str) -> Any:
    """The run's row once ``status`` was delivered, else None."""
    row = threads.inspect_agent_tool_run(run_id)
    return row if row is not None and status in row.delivered else None


# -- agents for worker subprocesses -----------------------------------------------------------

GATE_TIMEOUT_S = 60.0


class DirIn(BaseModel):
    path: str = Field(description="The working directory")


def _work_dir(messages: list[Any]) -> str:
    """The directory named by the last user message (``"work <dir>"``)."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    _, _, path = str(part.content).partition(" ")
                    return path.strip()
    raise ValueError("no user message in the conversation")


def _last_tool_return(messages: list[Any]) -> str:
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    return str(part.content)
    raise ValueError("no tool result in the conversation")


def _write_files(inp: DirIn, ctx: Any) -> str:
    with open(Path(inp.path) / "writes.log", "a") as log:
        log.write(f"{ctx.effect_key}\n")
    return "wrote 3 files"


def _wait_for_gate(inp: DirIn, ctx: Any) -> str:
    directory = Path(inp.path)
    with open(directory / "gate.entered", "a") as log:
        log.write(f"{ctx.effect_key}\n")
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not (directory / "gate").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the gate was never opened")
        time.sleep(0.02)
    return "the gate opened"


write_files = tool(
    name="write_files",
    description="Write the output files (idempotent by effect key).",
    input=DirIn,
    effect="idempotent",
    dedup_window_ms=600_000,
    execute=_write_files,
)
wait_for_gate = tool(
    name="wait_for_gate",
    description="Wait until the gate opens.",
    input=DirIn,
    effect="read_only",
    execute=_wait_for_gate,
)

writer_child = Agent(
    name="at_writer_child",
    instructions="Write the files, wait for the gate, then report.",
    model=ScriptedModel(
        [
            lambda messages: call("write_files", path=_work_dir(messages)),
            lambda messages: call("wait_for_gate", path=_work_dir(messages)),
            say("wrote the files and passed the gate"),
        ]
    ),
    tools=[write_files, wait_for_gate],
    # write_files is idempotent, not read_only: without this it would wait for an approval.
    permissions=Permissions.allow_all(),
)

delegating_parent = Agent(
    name="at_delegating_parent",
    instructions="Delegate the work to the writer, then report what it said.",
    model=ScriptedModel(
        [
            lambda messages: call("writer", message=f"work {_work_dir(messages)}"),
            lambda messages: say(f"the writer said: {_last_tool_return(messages)}"),
        ]
    ),
    tools=[agent_tool(writer_child, "Write files in a directory.", name="writer", display_name="Writer")],
    # The child is capped by its parent's permissions: accept_edits lets its idempotent
    # write_files run without asking.
    permissions=Permissions("accept_edits"),
)

quick_worker_child = Agent(
    name="at_quick_child", instructions="Answer at once.", model=ScriptedModel([say("quick child done")])
)

ALL_AGENTS = (writer_child, delegating_parent, quick_worker_child)
