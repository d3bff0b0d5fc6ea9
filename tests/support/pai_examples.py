"""The official ``pydantic-ai-examples`` agents, loaded as their authors wrote them, for side-by-side tests.

The package is installed by :func:`install` into a folder of the test session's own (``pip install
--target``, without its dependencies: it pins an older Pydantic AI and pulls in Gradio, Modal and
more, none of which these agents use). Its modules call ``logfire.configure()`` when imported;
``logfire`` is not installed here, so a stand-in whose functions do nothing is in ``sys.modules``
while they are imported, and nowhere else. Their model strings are never resolved: every run
passes its own model.

The dependency factories below are module-level, as ``from_pydantic_ai(deps=...)`` needs; the
weather tools' HTTP client answers from a table instead of the network.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import sqlite3
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VERSION = "2.62.0"
MODULES = ("bank_support", "flight_booking", "weather_agent", "pydantic_model")


def install(target: Path) -> None:
    """``pydantic-ai-examples`` into ``target`` (no dependencies); raises CalledProcessError."""
    if (target / "pydantic_ai_examples").is_dir():
        return
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), f"pydantic-ai-examples=={VERSION}"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip


@contextlib.contextmanager
def _logfire_stand_in() -> Iterator[None]:
    import pydantic_ai  # noqa: F401 - imported first, with the real logfire_api it expects

    stand_in = types.ModuleType("logfire")
    for name in ("configure", "instrument_pydantic_ai", "instrument_httpx", "instrument_asyncpg", "info", "debug"):
        setattr(stand_in, name, lambda *args, **kwargs: None)
    stand_in.span = lambda *args, **kwargs: contextlib.nullcontext()  # type: ignore[attr-defined]
    previous = sys.modules.get("logfire")
    sys.modules["logfire"] = stand_in
    try:
        yield
    finally:
        if previous is None:
            sys.modules.pop("logfire", None)
        else:
            sys.modules["logfire"] = previous


def load(target: Path) -> dict[str, Any]:
    """The example modules by name, imported from ``target``."""
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    with _logfire_stand_in():
        return {name: importlib.import_module(f"pydantic_ai_examples.{name}") for name in MODULES}


def _module(name: str) -> Any:
    return sys.modules[f"pydantic_ai_examples.{name}"]


# -- dependency factories, as a worker would build them --------------------------------------------


class Customers:
    """The bank support example's database, as its ``DatabaseConn`` means it (that class reads a
    cursor it never opens in this release, so both sides would fail alike before any turn)."""

    def __init__(self) -> None:
        self.connection = sqlite3.connect(":memory:", check_same_thread=False)
        self.connection.execute("CREATE TABLE customers(id, name, balance)")
        self.connection.execute("INSERT INTO customers VALUES (123, 'John', 123.45)")

    async def customer_name(self, *, id: int) -> str | None:
        row = self.connection.execute("SELECT name FROM customers WHERE id=?", (id,)).fetchone()
        return row[0] if row else None

    async def customer_balance(self, *, id: int) -> float:
        row = self.connection.execute("SELECT balance FROM customers WHERE id=?", (id,)).fetchone()
        if row is None:
            raise ValueError("Customer not found")
        return float(row[0])


def bank_deps() -> Any:
    """The bank support example's dependencies: customer 123 and its database, in memory."""
    return _module("bank_support").SupportDependencies(customer_id=123, db=Customers())


def flight_deps() -> Any:
    """The flight search example's dependencies: the page it reads and what the user asked for."""
    flights = _module("flight_booking")
    return flights.Deps(
        web_page_text="1. Flight SFO-AK123\n- Price: $350\n- Origin: San Francisco International Airport (SFO)",
        req_origin="SFO",
        req_destination="ANC",
        req_date=datetime.date(2025, 1, 10),
    )


_WEATHER_ANSWERS = {
    "/latlng": '{"lat": 51.5, "lng": -0.1}',
    "/number": "21",
    "/weather": "Sunny",
}


def weather_deps() -> Any:
    """The weather example's dependencies: an HTTP client that answers from a table, offline."""
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=_WEATHER_ANSWERS[request.url.path])

    return _module("weather_agent").Deps(client=httpx.AsyncClient(transport=httpx.MockTransport(answer)))
