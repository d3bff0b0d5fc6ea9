"""The agents the stream-completeness test's worker and API load
(``THREADS_AGENTS=tests.integration.stream_tail_agents``).

``tail_writer`` streams its reply in many small fragments, close together, and its turn ends at
once after the last one: the tail of the step is what a subscriber is most likely to lose.
``long_writer`` answers its thread's first run in a word, and its second with a long reply,
fragment by fragment, for a reader too slow to keep up.
"""

from __future__ import annotations

from threads_celery import Agent
from threads_celery.testing import ScriptedModel, say

#: 300 characters in 100 fragments of 3, as fast as the model's stream goes.
TAIL_REPLY = "".join(f"t{i:03d}." for i in range(60))
#: 2,000 fragments of 2,500 characters, a millisecond apart (5 MB in 2 to 3 s: more than the
#: socket buffers between the API and a client that reads nothing, and the API's queue, hold).
LONG_REPLY = "".join(f"{i:05d}" + "x" * 2495 for i in range(2000))

tail_writer = Agent(
    name="tail_writer",
    instructions="Write.",
    model=ScriptedModel([say(TAIL_REPLY)], chunk_size=3, model_name="tail-writer"),
)
long_writer = Agent(
    name="long_writer",
    instructions="Write at length.",
    model=ScriptedModel(
        [say("ready"), say(LONG_REPLY)], per="thread", chunk_size=2500, chunk_delay_s=0.001, model_name="long-writer"
    ),
)

ALL_AGENTS = [tail_writer, long_writer]
