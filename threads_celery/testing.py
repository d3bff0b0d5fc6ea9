"""Fakes shipped for tests: a scripted model that drives agents offline, and a provider emulator.

A :class:`ScriptedModel` answers each model turn from a script. Which entry answers is derived
from the conversation it is shown (the number of model replies since the last user message), not
from state in memory, so the same script gives the same run in any worker process and after any
retry.

>>> model = ScriptedModel([call("get_weather", city="Paris"), say("It is 21 degrees in Paris.")])

A :class:`ProviderEmulator` (see :mod:`threads_celery.provider_emulator`) is the other way round:
a real OpenAI-compatible server on loopback, for agents that name a model string, which keeps a
ledger of every request it billed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Literal

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from threads_celery.provider_emulator import BilledRequest, ProviderEmulator

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted model turn: some text and/or tool calls (name, JSON arguments)."""

    text: str = ""
    calls: tuple[tuple[str, str], ...] = field(default=())


def say(text: str) -> Reply:
    """A turn that only answers in text."""
    return Reply(text=text)


def call(name: str, args: dict[str, Any] | str | None = None, /, **kwargs: Any) -> Reply:
    """A turn that calls one tool. ``args`` may be raw text (to script malformed JSON)."""
    return calls((name, args if args is not None else kwargs))


def calls(*pairs: tuple[str, dict[str, Any] | str]) -> Reply:
    """A turn that calls several tools, in order."""
    return Reply(calls=tuple((name, a if isinstance(a, str) else json.dumps(a)) for name, a in pairs))


ScriptEntry = Reply | str | Callable[[list[ModelMessage]], "Reply | str"]


class ScriptExhausted(RuntimeError):
    """The scripted model was asked for more turns than its script holds."""


class ScriptedModel(FunctionModel):
    """A pydantic-ai model that plays a script, streamed in small chunks like a real provider.

    ``per="run"`` restarts the script at each user message; ``per="thread"`` plays it once across
    the whole conversation. A string entry is a text reply; a callable entry is given the
    pydantic-ai messages and returns a Reply or a string.
    """

    def __init__(
        self,
        script: Sequence[ScriptEntry],
        *,
        per: Literal["run", "thread"] = "run",
        chunk_size: int = 8,
        chunk_delay_s: float = 0.0,
        model_name: str = "scripted",
    ) -> None:
        self.script = list(script)
        self.per = per
        self.chunk_size = max(1, chunk_size)
        #: A pause before each chunk, as a slow provider streams (for live-delta tests).
        self.chunk_delay_s = chunk_delay_s
        super().__init__(self._respond, stream_function=self._stream, model_name=model_name)

    def reply_for(self, messages: list[ModelMessage]) -> Reply:
        """The scripted reply for a conversation."""
        turn = self._turn_index(messages)
        if turn >= len(self.script):
            raise ScriptExhausted(f"the script has {len(self.script)} turns and turn {turn + 1} was asked for")
        entry = self.script[turn]
        if callable(entry) and not isinstance(entry, Reply):
            entry = entry(messages)
        return Reply(text=entry) if isinstance(entry, str) else entry

    def _turn_index(self, messages: list[ModelMessage]) -> int:
        count = 0
        for message in reversed(messages):
            if isinstance(message, ModelResponse):
                count += 1
            elif (
                self.per == "run"
                and isinstance(message, ModelRequest)
                and any(isinstance(p, UserPromptPart) for p in message.parts)
            ):
                break
        return count

    def _call_id(self, messages: list[ModelMessage], index: int) -> str:
        return f"call_{len(messages)}_{index}"

    async def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        reply = self.reply_for(messages)
        parts: list[Any] = [TextPart(content=reply.text)] if reply.text else []
        parts.extend(
            ToolCallPart(tool_name=name, args=args, tool_call_id=self._call_id(messages, i))
            for i, (name, args) in enumerate(reply.calls)
        )
        return ModelResponse(parts=parts or [TextPart(content="")])

    async def _pause(self) -> None:
        if self.chunk_delay_s > 0:
            await asyncio.sleep(self.chunk_delay_s)

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        reply = self.reply_for(messages)
        size = self.chunk_size
        for start in range(0, len(reply.text), size):
            await self._pause()
            yield reply.text[start : start + size]
        for i, (name, args) in enumerate(reply.calls):
            await self._pause()
            yield {i: DeltaToolCall(name=name, json_args="", tool_call_id=self._call_id(messages, i))}
            for start in range(0, len(args), size):
                await self._pause()
                yield {i: DeltaToolCall(json_args=args[start : start + size])}
        if not reply.text and not reply.calls:
            yield ""


@contextmanager
def start_worker(
    threads: Threads,
    *,
    queues: Sequence[str] | None = None,
    reconcile_interval: float | EllipsisType | None = ...,
) -> Iterator[Threads]:
    """Run an in-process Celery worker for ``threads`` while the block runs, then stop it.

    For your own integration tests against PostgreSQL and a real broker, as Celery's
    ``celery.contrib.testing.worker.start_worker`` is for plain Celery: the real worker machinery
    (consumer, acks, retries) with a thread pool, in the test's process, so a test can
    ``threads.start(...)`` and ``threads.wait(...)`` with no worker process to manage. It consumes
    the work and control queues plus the queues of the agents registered on ``threads`` and of
    their tools (register them first), or ``queues``. It runs the reconcile backbone too, as Beat
    would, every ``reconcile_interval`` seconds (the settings' interval by default; None: never). Give each test run a broker database (or vhost) of its
    own: another worker on the same queues would take these tasks.

    >>> with Threads(database_url=pg_url, broker_url=redis_url) as threads:  # doctest: +SKIP
    ...     threads.migrate()
    ...     threads.register(agent)
    ...     with start_worker(threads):
    ...         run = threads.wait(threads.start("trip-planner", "Plan dinner").run_id, timeout=30)
    """
    threads.start_worker(queues=queues, reconcile_interval=reconcile_interval)
    try:
        yield threads
    finally:
        threads.stop_worker()


__all__ = [
    "BilledRequest",
    "ProviderEmulator",
    "Reply",
    "ScriptExhausted",
    "ScriptedModel",
    "call",
    "calls",
    "say",
    "start_worker",
]
