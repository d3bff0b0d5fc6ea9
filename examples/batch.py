"""A scheduled batch agent: a nightly sales report, written every day at 02:00 UTC.

Run it with PostgreSQL and Redis (see docs/schedules.md; the production quick-start in
docs/production.md runs it next to the demo agent)::

    export THREADS_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/threads
    export THREADS_BROKER_URL=redis://127.0.0.1:6379/0
    export THREADS_AGENTS=examples.demo,examples.batch   # every agent the workers on this queue serve
    export PYTHONPATH=.                         # from the repository root: makes `examples` importable
    threads-celery db upgrade
    celery -A tasks worker --loglevel INFO -n batch@%h   # runs the reports
    celery -A tasks beat --loglevel INFO        # publishes one run per night

Beat reads ``SCHEDULES`` below from the modules in ``THREADS_AGENTS`` and, at 02:00 UTC, publishes
``threads.scheduled_run("nightly-report", "<date>T02:00:00+00:00")``. The worker starts the run
``sched:nightly-report:<date>T020000Z`` on a thread of its own; a second Beat, or a redelivered
message, finds that run and starts nothing. If Beat was down for more than a night,
``missed="run_once"`` writes one report, for the latest night missed, when it comes back.

To watch it without waiting for 02:00, make the schedule an interval (Beat and the worker must
agree, so set it for both)::

    export BATCH_EVERY_S=20

and follow the reports with ``threads-celery runs list`` and ``threads-celery runs show RUN_ID``.

The agent runs unattended, so its one tool is ``read_only`` (read_only tools need no approval):
``gather_figures`` returns the day's figures (made up here, deterministically, from the date; in
real life, a query to your warehouse). The model is a
:class:`~threads_celery.testing.ScriptedModel`, so the example needs no API key; set
``THREADS_BATCH_MODEL`` (e.g. ``openai:gpt-4o-mini``) to use a real one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart

from threads_celery import Agent, Schedule, ToolContext, crontab, tool
from threads_celery.testing import Reply, ScriptedModel

REGIONS = ("north", "south", "east", "west")


class FiguresIn(BaseModel):
    day: str = Field(description="The day to report on, YYYY-MM-DD")


def _gather_figures(inp: FiguresIn, ctx: ToolContext) -> dict[str, Any]:
    datetime.strptime(inp.day, "%Y-%m-%d")  # a bad date is an error the model can fix
    seed = int(hashlib.sha256(inp.day.encode()).hexdigest(), 16)
    by_region = {region: 1000 + (seed >> (8 * i)) % 9000 for i, region in enumerate(REGIONS)}
    return {
        "day": inp.day,
        "orders": 40 + seed % 160,
        "revenue_eur": sum(by_region.values()),
        "revenue_by_region_eur": by_region,
        "refunds": seed % 7,
    }


gather_figures = tool(
    name="gather_figures",
    description="Gather a day's sales figures: orders, revenue (total and by region), refunds.",
    input=FiguresIn,
    effect="read_only",
    execute=_gather_figures,
)


# -- the scripted model ------------------------------------------------------------------------


def _day(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    found = re.search(r"\d{4}-\d{2}-\d{2}", part.content)
                    if found:
                        return found.group(0)
    return datetime.now().strftime("%Y-%m-%d")


def _figures(messages: list[ModelMessage]) -> dict[str, Any]:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == "gather_figures":
                    content = part.content
                    return json.loads(content) if isinstance(content, str) else content
    return {}


def _ask_for_figures(messages: list[ModelMessage]) -> Reply:
    day = _day(messages)
    return Reply(text=f"Gathering the figures for {day}.", calls=(("gather_figures", json.dumps({"day": day})),))


def _write_report(messages: list[ModelMessage]) -> str:
    figures = _figures(messages)
    if not figures.get("day"):
        return "I could not gather the figures, so there is no report tonight."
    regions = figures["revenue_by_region_eur"]
    best = max(regions, key=regions.get)
    return (
        f"Sales report for {figures['day']}\n"
        f"- Orders: {figures['orders']}\n"
        f"- Revenue: EUR {figures['revenue_eur']:,} (best region: {best}, EUR {regions[best]:,})\n"
        f"- Refunds: {figures['refunds']}"
    )


def _model() -> Any:
    configured = os.environ.get("THREADS_BATCH_MODEL", "").strip()
    if configured:
        return configured
    return ScriptedModel([_ask_for_figures, _write_report], model_name="nightly-report-script")


agent = Agent(
    name="nightly-report",
    instructions=(
        "You write the nightly sales report. Gather the figures for the day named in the "
        "message with gather_figures, then summarise orders, revenue (with the best region) "
        "and refunds in a few lines."
    ),
    model=_model(),
    tools=[gather_figures],
)


def report_request(slot: datetime) -> str:
    """The message of a slot's run: the report for the day that ended before the slot."""
    return f"Write the sales report for {(slot - timedelta(days=1)):%Y-%m-%d}."


def _every() -> timedelta | crontab:
    seconds = os.environ.get("BATCH_EVERY_S", "").strip()
    return timedelta(seconds=int(seconds)) if seconds else crontab(hour=2, minute=0)


SCHEDULES = [
    Schedule("nightly-report", agent, report_request, every=_every(), thread="new", missed="run_once"),
]

__all__ = ["SCHEDULES", "agent", "gather_figures", "report_request"]
