"""Model usage: what each model call used and cost, and the durable limits checked before each call.

Every committed model step records its usage (one request, input and output tokens, and the cost
when the model has a price in the price table). Sums per run, per thread and per agent over a UTC
day are read from the ledger, so limits hold across workers, retries and restarts.

- :class:`Prices` is the price table: ``THREADS_MODEL_PRICES`` as JSON, per model name, in a
  currency of your choice per million tokens: ``{"openai:gpt-4o-mini": {"input": 0.15,
  "output": 0.6}}``. A model is looked up by the agent's model string, then by the name the
  provider reported.
- :class:`UsageLimits` is an agent's limits: ``Agent(..., usage_limits=UsageLimits(per_run=
  Limits(input_tokens=50_000), per_agent_per_day=Limits(cost=20.0)))``. Before each model call
  the run's, the thread's and the agent's day totals are checked; a run that reached one ends
  ``interrupted`` with an error starting ``usage-limit:`` (``on_limit="interrupt"``), or waits
  ``parked`` for a person (``on_limit="ask"``), who lets it go on with ``Threads.allow_usage``:
  usage is then counted again from that moment.
- :func:`limit_reached` is the decision: a pure function of the totals and the limits.
- A step's attempts that the provider may have billed and the run threw away count too: an
  attempt whose worker died or lost its lease while it held the step, or whose answer could
  not be stored (:meth:`threads_celery.records.Run.voided_after_claim`). The step's usage
  counts each as one more request, with the tokens of the attempt that committed (the same
  prompt; a reply as long): what you may have been charged, never less.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from threads_celery.exceptions import ConfigError
from threads_celery.records import UsageTotals

PRICES_VARIABLE = "THREADS_MODEL_PRICES"
LIMIT_REASON = "usage-limit"
#: The event a person's allowance leaves in the thread's log; usage counts again from it.
ALLOWED_EVENT = "usage.allowed"

OnLimit = Literal["interrupt", "ask"]
Scope = Literal["run", "thread", "agent-day"]


def _positive_number(owner: str, name: str, value: object, *, whole: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{owner}: {name} must be a number, not {value!r}")
    if whole and not isinstance(value, int):
        raise ConfigError(f"{owner}: {name} must be a whole number, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{owner}: {name} must be a positive, finite number, not {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps over one scope; None leaves a measure uncapped. Cost is in the price table's currency."""

    requests: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            _positive_number("Limits", f.name, getattr(self, f.name), whole=f.name != "cost")
        if all(getattr(self, f.name) is None for f in fields(self)):
            raise ConfigError("Limits: set at least one of requests, input_tokens, output_tokens, total_tokens, cost")


@dataclass(frozen=True, slots=True)
class UsageLimits:
    """An agent's usage limits per run, per thread and per agent per UTC day."""

    per_run: Limits | None = None
    per_thread: Limits | None = None
    per_agent_per_day: Limits | None = None
    on_limit: OnLimit = "interrupt"

    def __post_init__(self) -> None:
        for name in ("per_run", "per_thread", "per_agent_per_day"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Limits):
                raise ConfigError(f"UsageLimits: {name} must be a Limits(...), not {value!r}")
        if self.on_limit not in ("interrupt", "ask"):
            raise ConfigError(f"UsageLimits: on_limit must be 'interrupt' or 'ask', not {self.on_limit!r}")
        if self.per_run is None and self.per_thread is None and self.per_agent_per_day is None:
            raise ConfigError("UsageLimits: set per_run, per_thread or per_agent_per_day")

    def scopes(self) -> list[tuple[Scope, Limits]]:
        pairs: list[tuple[Scope, Limits | None]] = [
            ("run", self.per_run),
            ("thread", self.per_thread),
            ("agent-day", self.per_agent_per_day),
        ]
        return [(scope, limits) for scope, limits in pairs if limits is not None]


@dataclass(frozen=True, slots=True)
class LimitReached:
    """The first limit a scope's totals reached: what to say and what to do."""

    scope: Scope
    measure: str
    used: float
    limit: float
    on_limit: OnLimit

    @property
    def message(self) -> str:
        what = {"run": "this run", "thread": "this thread", "agent-day": "this agent today (UTC)"}[self.scope]
        used = f"{self.used:g}" if self.measure == "cost" else str(int(self.used))
        return f"{LIMIT_REASON}: {what} used {used} {self.measure.replace('_', ' ')}, its limit is {self.limit:g}"


def limit_reached(totals: Mapping[Scope, UsageTotals], limits: UsageLimits) -> LimitReached | None:
    """The first limit reached (used >= limit) by the totals, scope by scope, or None."""
    for scope, caps in limits.scopes():
        used = totals.get(scope, UsageTotals())
        measures: list[tuple[str, float | None, float]] = [
            ("requests", caps.requests, used.requests),
            ("input_tokens", caps.input_tokens, used.input_tokens),
            ("output_tokens", caps.output_tokens, used.output_tokens),
            ("total_tokens", caps.total_tokens, used.total_tokens),
            ("cost", caps.cost, used.cost or 0.0),
        ]
        for measure, cap, value in measures:
            if cap is not None and value >= cap:
                return LimitReached(scope, measure, value, cap, limits.on_limit)
    return None


@dataclass(frozen=True, slots=True)
class Price:
    """Price per million input and output tokens."""

    input: float
    output: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


@dataclass(frozen=True, slots=True)
class Prices:
    """The price table: model name -> :class:`Price`."""

    table: Mapping[str, Price]

    @classmethod
    def from_json(cls, raw: str, *, source: str = PRICES_VARIABLE) -> Prices:
        """Parse ``{"model": {"input": per_mtok, "output": per_mtok}}``; ConfigError on nonsense."""
        if not raw.strip():
            return cls({})
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{source} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{source} must be a JSON object of model name -> price")
        table: dict[str, Price] = {}
        for model, price in data.items():
            if not isinstance(price, dict) or set(price) != {"input", "output"}:
                raise ConfigError(f"{source}: {model!r} needs exactly 'input' and 'output' (per million tokens)")
            for side in ("input", "output"):
                value = price[side]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ConfigError(f"{source}: {model!r} {side} price must be a number, not {value!r}")
                if not math.isfinite(value) or value < 0:
                    raise ConfigError(f"{source}: {model!r} {side} price must be zero or more, not {value!r}")
            table[str(model)] = Price(float(price["input"]), float(price["output"]))
        return cls(table)

    def cost(self, models: tuple[str, ...], input_tokens: int, output_tokens: int) -> float | None:
        """The cost of a call under the first of ``models`` that has a price, else None."""
        for model in models:
            price = self.table.get(model)
            if price is not None:
                return price.cost(input_tokens, output_tokens)
        return None


__all__ = [
    "ALLOWED_EVENT",
    "LIMIT_REASON",
    "LimitReached",
    "Limits",
    "Price",
    "Prices",
    "UsageLimits",
    "day_bounds",
    "limit_reached",
    "named_day",
]


def day_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The UTC day that holds ``now``: [midnight, next midnight)."""
    start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def named_day(text: str, *, now: datetime) -> date:
    """The UTC day ``text`` names: ``YYYY-MM-DD`` or ``today`` (the UTC day of ``now``).

    Raises ValueError for anything else. The CLI's ``--day`` and the API's ``?day=`` read days with it.
    """
    if text.strip().lower() == "today":
        return now.astimezone(UTC).date()
    return date.fromisoformat(text.strip())
