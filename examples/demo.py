"""A trip-planner agent that runs offline: the demo for ``threads-celery run``.

    threads-celery run examples/demo.py:agent "plan a dinner in Lisbon"
    threads-celery run examples/demo.py:agent "plan a dinner in Rome" --approve

It has one tool of each kind that matters after a crash:

- ``get_weather`` is ``read_only``: rerunning it is always safe.
- ``book_table`` is ``idempotent`` with a one-day ``dedup_window_ms``: it sends ``ctx.effect_key``
  to the (pretend) booking provider as the idempotency key, so a retry inside the window gets the
  same booking, and its confirmation code is derived from that key.
- ``send_email`` is ``unguarded``: it appends to a local outbox file
  (``.threads-celery/demo-outbox.jsonl`` in the current directory). If a worker dies mid-call, the
  runtime cannot know whether the email went out, so it parks the call for a person instead of
  sending it twice.

By default a :class:`~threads_celery.testing.ScriptedModel` plays the model, so the demo needs
no network and no API key. To drive the same tools with a real model, name it in
``THREADS_DEMO_MODEL``::

    pip install 'threads-celery[openai]'
    export OPENAI_API_KEY=sk-...
    THREADS_DEMO_MODEL=openai:gpt-4o-mini threads-celery run examples/demo.py:agent "plan a dinner in Paris"

The agent keeps the default permissions: ``get_weather`` runs freely, while ``book_table`` and
``send_email`` wait for approval. In a terminal, ``threads-celery run`` asks you; pass
``--approve`` to approve every call of the run (a run that nobody can ask stops with exit code 3,
awaiting approval). A declined call is reported to the model, which plans around it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart

from threads_celery import Agent, ToolContext, tool
from threads_celery.testing import Reply, ScriptedModel

OUTBOX = Path(".threads-celery") / "demo-outbox.jsonl"
CITIES = ("Lisbon", "Paris", "Rome", "Berlin", "Tokyo", "Oslo", "Madrid", "Vienna")
RESTAURANTS = {
    "Lisbon": "Taberna da Rua das Flores",
    "Paris": "Le Baratin",
    "Rome": "Roscioli",
    "Berlin": "Lode & Stijn",
    "Tokyo": "Sushi Saito",
    "Oslo": "Maaemo",
    "Madrid": "Sobrino de Botín",
    "Vienna": "Gasthaus Pöschl",
}


# -- tools -------------------------------------------------------------------------------------


class WeatherIn(BaseModel):
    city: str = Field(description="City name, e.g. Lisbon")
    day: str = Field("tomorrow", description="Which day: 'today', 'tomorrow' or a date")


def _get_weather(inp: WeatherIn, ctx: ToolContext) -> dict[str, Any]:
    # Deterministic pretend weather, so the demo prints the same thing every time.
    seed = int(hashlib.sha256(inp.city.lower().encode()).hexdigest(), 16)
    conditions = ("sunny", "partly cloudy", "light rain", "clear")[seed % 4]
    return {"city": inp.city, "day": inp.day, "conditions": conditions, "high_c": 14 + seed % 14}


get_weather = tool(
    name="get_weather",
    description="Get the weather forecast for a city.",
    input=WeatherIn,
    effect="read_only",
    execute=_get_weather,
)


class BookingIn(BaseModel):
    restaurant: str = Field(description="Restaurant name")
    city: str = Field(description="City the restaurant is in")
    time: str = Field(description="Time of the booking, e.g. 20:00")
    party_size: int = Field(ge=1, le=12, description="Number of guests")


def _book_table(inp: BookingIn, ctx: ToolContext) -> dict[str, Any]:
    # A real provider would receive ctx.effect_key as its idempotency key and return the same
    # booking for every retry of this call; deriving the code from the key plays that part.
    code = "TBL-" + hashlib.sha256(ctx.effect_key.encode()).hexdigest()[:8].upper()
    return {
        "confirmation": code,
        "restaurant": inp.restaurant,
        "city": inp.city,
        "time": inp.time,
        "party_size": inp.party_size,
    }


book_table = tool(
    name="book_table",
    description="Book a restaurant table. Returns a confirmation code.",
    input=BookingIn,
    effect="idempotent",
    dedup_window_ms=24 * 60 * 60 * 1000,
    execute=_book_table,
)


class EmailIn(BaseModel):
    to: str = Field(description="Recipient address")
    subject: str
    body: str


def _send_email(inp: EmailIn, ctx: ToolContext) -> str:
    OUTBOX.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "to": inp.to,
        "subject": inp.subject,
        "body": inp.body,
        "effect_key": ctx.effect_key,
        "at": datetime.now(UTC).isoformat(),
    }
    with OUTBOX.open("a", encoding="utf-8") as outbox:
        outbox.write(json.dumps(record) + "\n")
    return f"sent to {inp.to}"


send_email = tool(
    name="send_email",
    description="Send an email (written to the local demo outbox).",
    input=EmailIn,
    effect="unguarded",
    execute=_send_email,
)


# -- the scripted model ------------------------------------------------------------------------


def _user_text(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _city(messages: list[ModelMessage]) -> str:
    text = _user_text(messages)
    for city in CITIES:
        if re.search(rf"\b{city}\b", text, re.IGNORECASE):
            return city
    return "Lisbon"


def _tool_result(messages: list[ModelMessage], name: str) -> Any:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == name:
                    content = part.content
                    if isinstance(content, str):
                        try:
                            return json.loads(content)
                        except json.JSONDecodeError:
                            return content
                    return content
    return None


def _check_weather(messages: list[ModelMessage]) -> Reply:
    city = _city(messages)
    return Reply(
        text=f"Let me check tomorrow's weather in {city} first.",
        calls=(("get_weather", json.dumps({"city": city, "day": "tomorrow"})),),
    )


def _book(messages: list[ModelMessage]) -> Reply:
    city = _city(messages)
    weather = _tool_result(messages, "get_weather") or {}
    where = "a terrace" if weather.get("conditions") in ("sunny", "clear") else "inside"
    booking = {"restaurant": RESTAURANTS[city], "city": city, "time": "20:00", "party_size": 2}
    return Reply(
        text=f"{weather.get('conditions', 'Fine').capitalize()} weather: I'll book a table ({where}).",
        calls=(("book_table", json.dumps(booking)),),
    )


def _email(messages: list[ModelMessage]) -> Reply | str:
    booking = _tool_result(messages, "book_table")
    if not isinstance(booking, dict):  # the booking was denied or failed: nothing to email
        return _answer(messages)
    body = (
        f"Dinner for {booking.get('party_size', 2)} at {booking.get('restaurant')} "
        f"({booking.get('city')}) tomorrow at {booking.get('time')}. "
        f"Confirmation: {booking.get('confirmation')}."
    )
    email = {"to": "me@example.com", "subject": "Your dinner booking", "body": body}
    return Reply(text="Booked. Sending you the details.", calls=(("send_email", json.dumps(email)),))


def _answer(messages: list[ModelMessage]) -> str:
    weather = _tool_result(messages, "get_weather") or {}
    booking = _tool_result(messages, "book_table")
    emailed = _tool_result(messages, "send_email")
    if not isinstance(booking, dict):  # denied or failed: the result is the reason, as text
        return f"I could not book a table ({booking}). Tomorrow looks {weather.get('conditions')}."
    mail = (
        "The details are in your inbox."
        if isinstance(emailed, str) and emailed.startswith("sent")
        else f"I could not email you the details ({emailed})."
    )
    return (
        f"Your evening in {booking['city']} is planned.\n"
        f"- Weather tomorrow: {weather.get('conditions')}, high of {weather.get('high_c')}°C.\n"
        f"- Table for {booking['party_size']} at {booking['restaurant']}, {booking['time']} "
        f"(confirmation {booking['confirmation']}).\n"
        f"- {mail}"
    )


def _model() -> Any:
    configured = os.environ.get("THREADS_DEMO_MODEL", "").strip()
    if configured:
        return configured
    return ScriptedModel([_check_weather, _book, _email, _answer], model_name="demo-script")


agent = Agent(
    name="trip-planner",
    instructions=(
        "You plan evenings out. Check the weather, book a table at a good restaurant for the "
        "user's city, email them the details, then summarise the plan."
    ),
    model=_model(),
    tools=[get_weather, book_table, send_email],
)

__all__ = ["agent", "book_table", "get_weather", "send_email"]
