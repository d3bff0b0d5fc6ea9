"""An existing Pydantic AI agent, made durable with one call: ``from_pydantic_ai``.

    threads-celery run examples/pydantic_ai_agent.py:agent "Order 42 arrived broken" --approve

``support`` below is a plain ``pydantic_ai.Agent``, written the way its authors already write
it: instructions, tools that take a ``RunContext`` with dependencies, an output type and model
settings. The last lines make it durable:

- ``lookup_order`` is stated ``read_only``: it runs freely and reruns after a crash;
- ``refund_order`` is stated ``idempotent`` with a one-day window: it sends ``ctx.tool_call_id``
  (the call's effect key, stable across reruns) to the pretend payment provider as the
  idempotency key;
- ``email_customer`` has no stated effect, so it is unguarded: it asks first, and after a crash
  mid-call it parks for a person instead of emailing twice.

The dependencies (a pretend shop client) are built in the worker by ``make_shop``, named by
import path; only ids travel through the broker. By default a scripted ``FunctionModel`` plays
the model, so the example needs no network; set ``THREADS_EXAMPLE_MODEL`` (e.g.
``openai:gpt-4o-mini``, with ``pip install 'threads-celery[openai]'`` and its API key) to use a
real one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from threads_celery import from_pydantic_ai


class SupportReply(BaseModel):
    """What the support agent answers with."""

    order_id: int
    refunded: bool
    message: str


@dataclass
class Shop:
    """A pretend shop client: refunds and emails are appended to a local file."""

    outbox: Path
    refunds: dict[str, float] = field(default_factory=dict)

    def record(self, kind: str, **data: Any) -> None:
        self.outbox.parent.mkdir(parents=True, exist_ok=True)
        with self.outbox.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **data}) + "\n")


def make_shop() -> Shop:
    """Build the tools' dependencies (in the worker, once per worker thread)."""
    return Shop(outbox=Path(os.environ.get("SHOP_OUTBOX", ".threads-celery/shop-outbox.jsonl")))


def play_support(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted model: look the order up, refund it, email the customer, then answer."""
    done = [p.tool_name for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    if "lookup_order" not in done:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": 42})])
    if "refund_order" not in done:
        return ModelResponse(parts=[ToolCallPart("refund_order", {"order_id": 42, "amount": 19.5})])
    if "email_customer" not in done:
        text = "Sorry about the broken mug: we refunded 19.50."
        return ModelResponse(parts=[ToolCallPart("email_customer", {"order_id": 42, "text": text})])
    reply = {"order_id": 42, "refunded": True, "message": "Refunded and the customer was told."}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, reply)])


support = Agent(
    os.environ.get("THREADS_EXAMPLE_MODEL") or FunctionModel(play_support),
    name="support",
    instructions="You help customers with their orders. Refund broken items, then tell the customer.",
    deps_type=Shop,
    output_type=SupportReply,
    model_settings={"temperature": 0.0},
)


@support.tool
def lookup_order(ctx: RunContext[Shop], order_id: int) -> dict[str, Any]:
    """Look an order up by its number."""
    return {"order_id": order_id, "item": "mug", "price": 19.5, "status": "delivered"}


@support.tool
def refund_order(ctx: RunContext[Shop], order_id: int, amount: float) -> str:
    """Refund an order (the payment provider drops a repeat with the same idempotency key)."""
    key = ctx.tool_call_id or ""
    ctx.deps.record("refund", order_id=order_id, amount=amount, idempotency_key=key)
    return f"refunded {amount:.2f} for order {order_id}"


@support.tool
def email_customer(ctx: RunContext[Shop], order_id: int, text: str) -> str:
    """Email the customer of an order."""
    ctx.deps.record("email", order_id=order_id, text=text)
    return "sent"


agent = from_pydantic_ai(
    support,
    effects={"lookup_order": "read_only", "refund_order": "idempotent"},
    dedup_window_ms=24 * 3600 * 1000,
    deps=make_shop,
)
