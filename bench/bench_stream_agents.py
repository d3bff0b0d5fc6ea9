"""What the stream-latency benchmark's worker imports (``THREADS_AGENTS=bench.bench_stream_agents``).

``bench_streamer``'s model reads its user message, ``"<markers> <interval_ms> <delay_ms>"``, waits
``delay_ms`` (so the benchmark's clients can subscribe first), then streams ``markers`` text
fragments, one every ``interval_ms``, each holding the wall-clock time it was produced at:
``@<time_ns>;``. A client that receives a fragment knows how long it took to reach it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from threads_celery import Agent


def _order(messages: list[ModelMessage]) -> tuple[int, float, float]:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    markers, interval_ms, delay_ms = part.content.split()
                    return int(markers), float(interval_ms) / 1000, float(delay_ms) / 1000
    return 10, 0.01, 0.0


async def _respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content="done")])


async def _stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
    markers, interval, delay = _order(messages)
    await asyncio.sleep(delay)
    for _ in range(markers):
        yield f"@{time.time_ns()};"
        await asyncio.sleep(interval)


bench_streamer = Agent(
    name="bench_streamer",
    instructions="Stream markers.",
    model=FunctionModel(_respond, stream_function=_stream, model_name="bench-streamer"),
)


#: The same kind of turn through a real provider's path (pydantic-ai's OpenAI model and the
#: ``openai`` SDK, streaming over HTTP): the benchmark points ``OPENAI_BASE_URL`` at a fake
#: OpenAI server that streams the reply in small chunks.
bench_provider = Agent(name="bench_provider", instructions="Write.", model="openai:gpt-4o-mini")
