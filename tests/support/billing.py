"""What a provider bills for one conversation, and the agents that hold it, durable and plain.

The conversation: the model asks for ``lookup(city)``, then answers with text from its result;
two requests, whoever drives it. :func:`provider_script` plays the provider's side from the
request alone (so any number of runs, on any workers, can share one emulator); ``durable_agent``
is the threads-celery agent (a worker loads this module with ``THREADS_AGENTS``), and
:func:`plain_agent` the same agent in plain Pydantic AI. Both name their model by string
(``openai:gpt-4o-mini``), as a user does: the provider is whatever ``OPENAI_BASE_URL`` says.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from threads_celery import Agent, tool

MODEL = "openai:gpt-4o-mini"
INSTRUCTIONS = "Look the city up, then say what you found."


class LookupIn(BaseModel):
    city: str = Field(description="The city to look up")


def _lookup(city: str) -> dict[str, Any]:
    return {"city": city, "population": len(city) * 100_000}


lookup = tool(
    name="lookup",
    description="Look a city up.",
    input=LookupIn,
    effect="read_only",
    execute=lambda inp, ctx: _lookup(inp.city),
)

durable_agent = Agent(name="billing", instructions=INSTRUCTIONS, model=MODEL, tools=[lookup])

ALL_AGENTS = [durable_agent]


def plain_agent() -> Any:
    """The same agent in plain Pydantic AI (built when asked: the import takes a second)."""
    import pydantic_ai

    # Plain Pydantic AI reads "openai:" as the Responses API even with OPENAI_BASE_URL set; an
    # OpenAI-compatible server (the emulator) speaks chat completions, as threads-celery assumes.
    plain = pydantic_ai.Agent(MODEL.replace("openai:", "openai-chat:"), instructions=INSTRUCTIONS)

    @plain.tool_plain(name="lookup")
    def _plain_lookup(city: str) -> dict[str, Any]:
        """Look a city up."""
        return _lookup(city)

    return plain


def provider_script(body: dict[str, Any]) -> dict[str, Any]:
    """The provider's answer to a request of the conversation: a lookup first, then the text."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"text": f"Found: {last.get('content')}"}
    prompt = str(last.get("content") or "")
    city = prompt.rpartition(" ")[2] or "Paris"
    return {"tool_calls": [{"name": "lookup", "arguments": {"city": city}}]}
