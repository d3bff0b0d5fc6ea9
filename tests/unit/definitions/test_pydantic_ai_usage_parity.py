"""``ctx.usage`` in a Pydantic AI agent's tools, plainly and durably.

Each case runs one agent with ``run_sync`` and, made durable with ``from_pydantic_ai``, on the
embedded runtime, and compares what the tools read of ``ctx.usage`` and what the run used:

- in a tool, ``ctx.usage`` holds the run's requests and tokens up to the reply that asked for the
  call, and the tool calls of earlier turns that succeeded;
- a delegate agent run inside a tool with ``usage=ctx.usage`` is the run's usage too:
  ``threads.usage(run_id=...)`` counts its requests and tokens, as the plain run's ``usage()``
  does, also when the tool raises after the delegate ran.
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from threads_celery import Permissions, Threads, from_pydantic_ai

WAIT_S = 30.0
_names = itertools.count()


def model(replies: list[list[Any]]) -> FunctionModel:
    """A model answering its n-th request (from 1) of a run with ``replies[n - 1]``."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(isinstance(m, ModelResponse) for m in messages)
        return ModelResponse(parts=replies[min(asked, len(replies) - 1)])

    return FunctionModel(answer)


def reader(seen: list[tuple[int, int, int]]) -> PydanticAgent[None, str]:
    """An agent whose tool records ctx.usage (requests, tool calls, input tokens) on two turns."""
    agent: PydanticAgent[None, str] = PydanticAgent(
        model(
            [
                [ToolCallPart("note", {"text": "a"})],
                [ToolCallPart("note", {"text": "b"})],
                [TextPart("done")],
            ]
        )
    )

    @agent.tool
    def note(ctx: RunContext[None], text: str) -> str:
        seen.append((ctx.usage.requests, ctx.usage.tool_calls, ctx.usage.input_tokens))
        return f"noted {text}"

    return agent


def durable(threads: Threads, plain: PydanticAgent[Any, Any], prompt: str = "go") -> tuple[Any, str]:
    agent = from_pydantic_ai(plain, name=f"usage_parity_{next(_names)}", permissions=Permissions.allow_all())
    run = threads.wait(threads.start(agent, prompt).run_id, WAIT_S)
    return run, run.id


def test_a_tool_reads_the_runs_usage_up_to_its_turn_as_plain_pydantic_ai_gives_it(threads: Threads) -> None:
    plain_seen: list[tuple[int, int, int]] = []
    plain = reader(plain_seen).run_sync("go")
    durable_seen: list[tuple[int, int, int]] = []
    run, _ = durable(threads, reader(durable_seen))

    assert plain.output == "done" and run.status == "completed", run.error
    assert [s[:2] for s in plain_seen] == [(1, 0), (2, 1)]
    assert [s[:2] for s in durable_seen] == [s[:2] for s in plain_seen]
    # The tokens too: those of every request up to the call's, as the store recorded them.
    assert all(s[2] > 0 for s in durable_seen) and durable_seen[1][2] > durable_seen[0][2]


def delegating(*, raise_after: bool = False) -> PydanticAgent[None, str]:
    """flight_booking's shape: the tool runs a delegate agent (two requests) with usage=ctx.usage."""
    delegate: PydanticAgent[None, str] = PydanticAgent(
        model([[ToolCallPart("fetch", {"q": "x"})], [TextPart("found LH 123")]])
    )

    @delegate.tool_plain
    def fetch(q: str) -> str:
        return f"flights for {q}"

    agent: PydanticAgent[None, str] = PydanticAgent(
        model([[ToolCallPart("search", {"route": "LIS-BER"})], [TextPart("booked")]])
    )

    @agent.tool
    async def search(ctx: RunContext[None], route: str) -> str:
        found = await delegate.run(f"search {route}", usage=ctx.usage)
        if raise_after:
            raise RuntimeError("the booking system is down")
        return found.output

    return agent


def test_a_delegate_agent_run_with_ctx_usage_is_counted_in_the_runs_usage(threads: Threads) -> None:
    plain = delegating().run_sync("book")
    run, run_id = durable(threads, delegating())

    assert plain.output == "booked" and run.status == "completed", run.error
    used = threads.usage(run_id=run_id)
    assert plain.usage.requests == 4  # two of the agent's, two of the delegate's
    assert used.requests == plain.usage.requests
    assert used.input_tokens == plain.usage.input_tokens
    assert used.output_tokens == plain.usage.output_tokens


def test_a_delegates_requests_are_counted_when_the_tool_raises_after_them(threads: Threads) -> None:
    run, run_id = durable(threads, delegating(raise_after=True))

    # The tool's error goes to the model, which answers: 2 requests of the agent's, 2 of the
    # delegate's, billed although the tool failed.
    assert run.status == "completed", run.error
    assert threads.usage(run_id=run_id).requests == 4
