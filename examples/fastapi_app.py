"""A shop's FastAPI app with agents inside it: its own auth, its own table, runs in its transactions.

Quick try, no services (SQLite and an in-process worker, in ``.threads-celery/shop.db``)::

    python -m examples.fastapi_app                    # http://127.0.0.1:8000/docs

On PostgreSQL and Redis, with a worker of its own (the shop's table lives in the store's
database, beside the ledger's tables)::

    export THREADS_DATABASE_URL=postgresql://127.0.0.1:5432/shop
    export THREADS_BROKER_URL=redis://127.0.0.1:6379/0
    threads-celery db upgrade
    THREADS_AGENTS=examples.fastapi_app celery -A tasks worker &
    uvicorn --factory examples.fastapi_app:create_app --port 8000

Then, as Alice of the tenant ``acme``::

    curl -X POST localhost:8000/orders -H 'X-API-Key: key-alice' -H 'content-type: application/json' \\
         -d '{"item": "blue mug", "quantity": 2}'
    curl localhost:8000/agents/v1/runs -H 'X-API-Key: key-alice'
    curl -N localhost:8000/agents/v1/threads/<thread_id>/events -H 'X-API-Key: key-alice'

and the staff console at http://127.0.0.1:8000/staff/console/ (HTTP Basic: ``carol`` /
``carol-password``, staff of ``acme``).

What it shows:

- The shop's own authentication: customers send an API key (``X-API-Key``), staff sign in with
  HTTP Basic. Each dependency maps the shop's user to a :class:`Caller`: who, and on behalf of
  which tenant (the customer's company).
- ``POST /orders`` saves an order in the shop's own table and starts a run about it in the same
  transaction (``threads.start(..., within=session)``): both commit, or neither does. An order
  refused after it was written (over the quantity limit) rolls back, and no run starts.
- The agents' HTTP API is the shop's own routes under ``/agents`` (``api_router``), behind the
  customers' API keys: a customer sees only its tenant's runs, streams their events, and gets
  the API's documented error bodies. The console is mounted for staff under ``/staff/console``.

The agent answers with a scripted model (no API key needed); ``SHOP_MODEL=openai:gpt-4o-mini``
(with the ``openai`` extra and ``OPENAI_API_KEY``) puts a real one in its place.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Annotated

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from pydantic import BaseModel, Field
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from sqlalchemy.orm import Session

from threads_celery import Agent, Threads
from threads_celery.api import Caller, api_router, create_console
from threads_celery.testing import ScriptedModel

# -- the shop's users ----------------------------------------------------------------------------
# A real shop reads these from its own user table; each customer belongs to a company (a tenant).

CUSTOMERS = {"key-alice": Caller("alice", "acme"), "key-bob": Caller("bob", "globex")}
STAFF = {"carol": ("carol-password", Caller("carol", "acme"))}


def customer(x_api_key: Annotated[str | None, Header()] = None) -> Caller:
    """The customer of a request's API key, as a Caller of its company's tenant; 401 otherwise."""
    for key, caller in CUSTOMERS.items():
        if x_api_key is not None and secrets.compare_digest(x_api_key.encode(), key.encode()):
            return caller
    raise HTTPException(401, "send your API key in X-API-Key", headers={"WWW-Authenticate": "ApiKey"})


basic = HTTPBasic(realm="shop staff", auto_error=False)


def staff_member(credentials: Annotated[HTTPBasicCredentials | None, Depends(basic)]) -> Caller:
    """A member of staff signed in with HTTP Basic (the browser asks), as a Caller of their tenant."""
    if credentials is not None and credentials.username in STAFF:
        password, caller = STAFF[credentials.username]
        if secrets.compare_digest(credentials.password.encode(), password.encode()):
            return caller
    raise HTTPException(401, "staff only", headers={"WWW-Authenticate": 'Basic realm="shop staff"'})


# -- the agent -----------------------------------------------------------------------------------


def _confirm(messages: list[ModelMessage]) -> str:
    """The scripted answer: a confirmation naming the order the run was started about."""
    asked = next(
        (
            part.content
            for message in reversed(messages)
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, UserPromptPart) and isinstance(part.content, str)
        ),
        "",
    )
    return f"Thank you for your order. Confirmed: {asked.removeprefix('New order: ')}. It ships tomorrow."


order_assistant = Agent(
    name="order_assistant",
    instructions="Confirm each new order to the customer in one friendly sentence.",
    # Streamed a few characters at a time, as a provider streams, so that a client sees it written.
    model=os.environ.get("SHOP_MODEL") or ScriptedModel([_confirm], chunk_size=4, chunk_delay_s=0.05),
)

# -- the shop's own table ------------------------------------------------------------------------

metadata = sa.MetaData()
orders = sa.Table(
    "shop_orders",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False, index=True),
    sa.Column("customer", sa.String(128), nullable=False),
    sa.Column("item", sa.String(200), nullable=False),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.Column("run_id", sa.String(200), nullable=False),
    sa.Column("thread_id", sa.String(200), nullable=False),
)

#: Orders of more than this are refused after they were written: the transaction rolls back.
MAX_QUANTITY = 100


class OrderIn(BaseModel):
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(ge=1)


class OrderOut(BaseModel):
    id: str
    item: str
    quantity: int
    run_id: str
    thread_id: str


# -- the app -------------------------------------------------------------------------------------


def create_app(threads: Threads | None = None) -> FastAPI:
    """The shop. Without ``threads``, from the environment: on ``THREADS_DATABASE_URL`` and
    ``THREADS_BROKER_URL`` when they are set (workers run the agent), else embedded (SQLite in
    ``.threads-celery/shop.db`` and an in-process worker)."""
    resources = ExitStack()
    if threads is None:
        if os.environ.get("THREADS_DATABASE_URL"):
            threads = resources.enter_context(Threads())
        else:
            Path(".threads-celery").mkdir(exist_ok=True)
            threads = resources.enter_context(Threads.embedded(".threads-celery/shop.db"))
    threads.register(order_assistant)
    # The shop's own engine, on the store's database: a run commits in the shop's transactions.
    engine = sa.create_engine(threads.store.engine.url.render_as_string(hide_password=False))
    resources.callback(engine.dispose)
    metadata.create_all(engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with resources:
            yield

    app = FastAPI(title="shop", lifespan=lifespan)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/orders", status_code=201, response_model=OrderOut)
    def place_order(order: OrderIn, caller: Annotated[Caller, Depends(customer)]) -> OrderOut:
        """Save the order and start the agent about it, in one transaction of the shop's."""
        order_id = f"ord_{uuid.uuid4().hex[:12]}"
        with Session(engine) as session, session.begin():
            run = threads.start(
                order_assistant,
                f"New order: {order.quantity} x {order.item}",
                tenant=caller.tenant,
                within=session,
            )
            session.execute(
                orders.insert().values(
                    id=order_id,
                    tenant=caller.tenant,
                    customer=caller.principal,
                    item=order.item,
                    quantity=order.quantity,
                    run_id=run.run_id,
                    thread_id=run.thread_id,
                )
            )
            if order.quantity > MAX_QUANTITY:  # a check late in the transaction: all of it rolls back
                raise HTTPException(409, f"at most {MAX_QUANTITY} of an item per order")
        return OrderOut(
            id=order_id, item=order.item, quantity=order.quantity, run_id=run.run_id, thread_id=run.thread_id
        )

    @app.get("/orders", response_model=list[OrderOut])
    def my_orders(caller: Annotated[Caller, Depends(customer)]) -> list[OrderOut]:
        """The orders of the caller's company."""
        with engine.connect() as connection:
            rows = connection.execute(orders.select().where(orders.c.tenant == caller.tenant).order_by(orders.c.id))
            return [OrderOut.model_validate(row, from_attributes=True) for row in rows]

    # The agents' API among the shop's own routes, behind the customers' API keys.
    app.include_router(api_router(threads, caller=customer), prefix="/agents")
    # The console for staff, behind HTTP Basic (no sign-in page of its own).
    app.mount("/staff/console", create_console(threads, caller=staff_member))
    return app


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
