"""Agents and tools the chaos worker processes load (``THREADS_AGENTS=tests.chaos.chaos_agents``).

One tool per effect class. Each records its real effect in the side-effect ledger
(:mod:`tests.chaos.effect_ledger`, file named by ``CHAOS_LEDGER``) and then sleeps, so a test can
kill the worker while the call is in flight with its effect already done. With
``sleep_first=true`` a tool sleeps *before* recording, so a kill lands before the effect happened.

Every run's user message is a JSON object that the scripted model turns into the tool's
arguments: ``{"ref": "...", "seconds": 30, "repeat_seconds": 0, "sleep_first": false}``.
``seconds`` is how long the first execution of an effect key sleeps and ``repeat_seconds`` how
long any later execution sleeps, so a call killed mid-sleep finishes quickly when run again.

Importing this module in a worker (``CHAOS_ROLE=worker``) also installs the crash-on-publish
hook (Celery's ``before_task_publish`` signal): when a task message's id (a tool call's without
the token of its publish: its effect key) or task name matches one of the comma-separated fnmatch
patterns in ``CHAOS_CRASH_ON_PUBLISH`` and its marker file in ``CHAOS_CRASH_MARKER_DIR`` does not
exist yet, the publishing process creates the marker and SIGKILLs itself just before the message
leaves: the transaction that recorded the message in the outbox has committed, the publish never
happens. Each matching message crashes its publisher once. Tests opt a run in by choosing its run id (e.g. patterns ``step:run_crashstep_*:1``). The
test process never sets ``CHAOS_ROLE``, so the hook is never installed there.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import time
from typing import Any

from pydantic import BaseModel, Field

from threads_celery import Agent, Found, NotFound, Reconcile, ToolContext, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import Reply, ScriptedModel, call, say

try:  # imported as tests.chaos.chaos_agents (workers, tests) or by path
    from tests.chaos.effect_ledger import Ledger
except ImportError:  # pragma: no cover
    from effect_ledger import Ledger  # type: ignore[no-redef]


class ChaosIn(BaseModel):
    ref: str = Field(description="Which test run this call belongs to")
    seconds: float = Field(default=0.0, description="Seconds the first execution of this call sleeps")
    repeat_seconds: float = Field(default=0.0, description="Seconds any later execution sleeps")
    sleep_first: bool = Field(default=False, description="Sleep before the effect instead of after it")


def _perform(tool_name: str):
    def execute(inp: ChaosIn, ctx: ToolContext) -> str:
        ledger = Ledger.from_env()
        first = not ledger.starts(ctx.effect_key)
        ledger.record("start", effect_key=ctx.effect_key, tool=tool_name, ref=inp.ref, attempt=ctx.attempt)
        pause = inp.seconds if first else inp.repeat_seconds
        if inp.sleep_first:
            time.sleep(pause)
        ledger.record("effect", effect_key=ctx.effect_key, tool=tool_name, ref=inp.ref, attempt=ctx.attempt)
        if not inp.sleep_first:
            time.sleep(pause)
        return f"done:{tool_name}:{inp.ref}"

    return execute


def lookup_in_ledger(effect_key: str) -> Found | NotFound:
    """The provider's answer: the call happened iff its effect is in the ledger."""
    if Ledger.from_env().effects(effect_key):
        return Found(f"found:{effect_key}")
    return NotFound()


read_only_tool = tool(
    name="fetch_quote",
    description="Read a quote (changes nothing).",
    input=ChaosIn,
    effect="read_only",
    execute=_perform("fetch_quote"),
)
idempotent_tool = tool(
    name="charge_with_key",
    description="Charge with an idempotency key the provider remembers for ten minutes.",
    input=ChaosIn,
    effect="idempotent",
    dedup_window_ms=600_000,
    execute=_perform("charge_with_key"),
)
idempotent_tiny_tool = tool(
    name="charge_with_short_key",
    description="Charge with an idempotency key the provider remembers for one millisecond.",
    input=ChaosIn,
    effect="idempotent",
    dedup_window_ms=1,
    execute=_perform("charge_with_short_key"),
)
reconcilable_tool = tool(
    name="charge_checked",
    description="Charge; the provider can say whether a key was charged (final answer).",
    input=ChaosIn,
    effect="reconcilable",
    reconcile=Reconcile(finality="final", lookup=lookup_in_ledger),
    execute=_perform("charge_checked"),
)
reconcilable_nonfinal_tool = tool(
    name="charge_checked_eventually",
    description="Charge; the provider's not-found answer may lag (nonfinal).",
    input=ChaosIn,
    effect="reconcilable",
    reconcile=Reconcile(finality="nonfinal", lookup=lookup_in_ledger),
    execute=_perform("charge_checked_eventually"),
)
unguarded_tool = tool(
    name="send_email",
    description="Send an email (cannot be checked or deduplicated).",
    input=ChaosIn,
    execute=_perform("send_email"),
)

#: effect class -> its tool
TOOLS = {
    "read_only": read_only_tool,
    "idempotent": idempotent_tool,
    "idempotent_tiny": idempotent_tiny_tool,
    "reconcilable": reconcilable_tool,
    "reconcilable_nonfinal": reconcilable_nonfinal_tool,
    "unguarded": unguarded_tool,
}
#: tool name -> effect class
EFFECT_CLASS_OF_TOOL = {t.name: cls for cls, t in TOOLS.items()}


def message(ref: str, *, seconds: float = 0.0, repeat_seconds: float = 0.0, sleep_first: bool = False) -> str:
    """The user message that makes a chaos agent call its tool with these arguments."""
    return json.dumps({"ref": ref, "seconds": seconds, "repeat_seconds": repeat_seconds, "sleep_first": sleep_first})


def _arguments(messages: list[Any]) -> dict[str, Any]:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for m in reversed(messages):
        if isinstance(m, ModelRequest):
            for part in m.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return json.loads(part.content)
    raise ValueError("no user message to take the tool arguments from")


def _script(*tool_names: str) -> ScriptedModel:
    def first_turn(messages: list[Any]) -> Reply:
        args = _arguments(messages)
        if len(tool_names) == 1:
            return call(tool_names[0], **args)
        return Reply(calls=tuple((name, json.dumps(args)) for name in tool_names))

    return ScriptedModel([first_turn, say("done")], model_name=f"chaos-{'-'.join(tool_names)}")


def _agent(name: str, *tools: Any) -> Agent:
    return Agent(
        name=name,
        instructions="Call the tool with the arguments you are given, then say done.",
        model=_script(*(t.name for t in tools)),
        tools=list(tools),
        permissions=Permissions.allow_all(),
    )


concurrent_read_tool = tool(
    name="fetch_quote_concurrently",
    description="Read a quote (changes nothing); several may run at once.",
    input=ChaosIn,
    effect="read_only",
    concurrent=True,
    execute=_perform("fetch_quote_concurrently"),
)

#: How many concurrent calls the parallel agent makes in one reply; the calls at the indices in
#: PARALLEL_SLOW sleep ``seconds`` on their first execution, the others return at once.
PARALLEL_CALLS = 4
PARALLEL_SLOW = (1, 3)


def _parallel_turn(messages: list[Any]) -> Reply:
    args = _arguments(messages)
    return Reply(
        calls=tuple(
            (
                concurrent_read_tool.name,
                json.dumps({**args, "seconds": args["seconds"] if i in PARALLEL_SLOW else 0.0}),
            )
            for i in range(PARALLEL_CALLS)
        )
    )


#: effect class -> the agent that calls that class's tool once
AGENTS: dict[str, Agent] = {cls: _agent(f"chaos_{cls}", t) for cls, t in TOOLS.items()}
#: one model reply with two calls: a read_only one then an idempotent one
mixed_agent = _agent("chaos_mixed", read_only_tool, idempotent_tool)
#: one model reply with four read_only calls (whose results do not wait for the disk) in order,
#: then an unguarded one
reads_agent = Agent(
    name="chaos_reads",
    instructions="Call the tools with the arguments you are given, then say done.",
    model=_script(*[read_only_tool.name] * 4, unguarded_tool.name),
    tools=[read_only_tool, unguarded_tool],
    permissions=Permissions.allow_all(),
)

chaos_read_only = AGENTS["read_only"]
chaos_idempotent = AGENTS["idempotent"]
chaos_idempotent_tiny = AGENTS["idempotent_tiny"]
chaos_reconcilable = AGENTS["reconcilable"]
chaos_reconcilable_nonfinal = AGENTS["reconcilable_nonfinal"]
chaos_unguarded = AGENTS["unguarded"]


#: one model reply with PARALLEL_CALLS concurrent read_only calls
parallel_agent = Agent(
    name="chaos_parallel",
    instructions="Call the tool several times at once, then say done.",
    model=ScriptedModel([_parallel_turn, say("done")], model_name="chaos-parallel"),
    tools=[concurrent_read_tool],
    permissions=Permissions.allow_all(),
)


#: A reply the model streams slowly (about 4 s), so a test can kill its worker mid-stream.
STREAMED_REPLY = " ".join(f"word{i}" for i in range(120))
streaming_agent = Agent(
    name="chaos_streaming",
    instructions="Say it slowly.",
    model=ScriptedModel([say(STREAMED_REPLY)], chunk_size=6, chunk_delay_s=0.03, model_name="chaos-streaming"),
)


def all_agents() -> list[Agent]:
    return [*AGENTS.values(), mixed_agent, reads_agent, parallel_agent, streaming_agent]


# -- crash between commit and publish -----------------------------------------------------------


def _crash_on_publish(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    patterns = [p for p in os.environ.get("CHAOS_CRASH_ON_PUBLISH", "").split(",") if p]
    marker_dir = os.environ.get("CHAOS_CRASH_MARKER_DIR")
    if not patterns or not marker_dir:
        return
    # A tool call's task id is its effect key and a token fresh to each publish: the patterns and
    # the once-only marker go by the key, so that the publish after the crash is not crashed too.
    task_id = re.sub(r"~[0-9a-f]{8}$", "", str((headers or {}).get("id", "")))
    if not any(fnmatch.fnmatchcase(task_id, p) or fnmatch.fnmatchcase(sender or "", p) for p in patterns):
        return
    marker = os.path.join(marker_dir, crash_marker_name(task_id))
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return  # this message already crashed its publisher once
    try:
        os.write(fd, f"{os.getpid()} {sender} {task_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def crash_marker_name(task_id: str) -> str:
    """The marker file that records (and stops a repeat of) the crash on publishing ``task_id``."""
    return "crashed-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)


if os.environ.get("CHAOS_ROLE") == "worker":
    from celery.signals import before_task_publish

    before_task_publish.connect(_crash_on_publish, weak=False)
