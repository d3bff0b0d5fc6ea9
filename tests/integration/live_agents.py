"""The agents the live-delta integration workers load (``THREADS_AGENTS=tests.integration.live_agents``)."""

from __future__ import annotations

from threads_celery import Agent
from threads_celery.testing import ScriptedModel, say

#: What the writer says, streamed 5 characters every 20 ms (about 1.5 s in all).
REPLY = " ".join(f"token{i}" for i in range(60))

live_writer = Agent(
    name="live_writer",
    instructions="Write.",
    model=ScriptedModel([say(REPLY)], chunk_size=5, chunk_delay_s=0.02, model_name="live-writer"),
)

ALL_AGENTS = [live_writer]
