"""A no-op MCP tool call through threads-celery against the same call on a persistent SDK session.

Three figures per transport (stdio and streamable HTTP, the test server of
``tests/support/mcp_test_server.py``; its ``lookup_city`` tool answers at once):

* ``sdk``: ``client.call_tool`` on one ``mcp.Client`` kept open, N calls in a row, as an
  application holding its own session would make them;
* ``threads``: :meth:`MCPServer.call`, what a tool task runs, from a worker thread's event loop
  (``runtime.models.run_coroutine``), through the process's session pool: the MCP layer's own
  cost per call. The target is at most 1.3x ``sdk``;
* ``durable``: the whole durable tool call on the embedded runtime (SQLite, the in-process
  worker): one model reply asking for N calls, the run's time over N. For scale only: it holds
  a ledger commit, a task and a model step's share.

Run by hand, never by CI::

    .venv/bin/python bench/mcp_calls.py --n 300 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.mcp_servers import http_server_process, stdio_server  # noqa: E402
from threads_celery import MCPServer  # noqa: E402

ARGS = {"city": "Metz"}


def sdk_per_call_ms(connect: Callable[[], Any], n: int) -> float:
    """Mean ms per call on one SDK client kept open (the handshake not counted)."""

    async def run() -> float:
        async with connect() as client:
            await client.call_tool("lookup_city", ARGS)  # warm
            started = time.perf_counter()
            for _ in range(n):
                await client.call_tool("lookup_city", ARGS)
            return (time.perf_counter() - started) * 1000 / n

    return asyncio.run(run())


def threads_per_call_ms(server: MCPServer, n: int) -> float:
    """Mean ms per :meth:`MCPServer.call`, from a worker thread's loop (the session kept)."""
    from threads_celery.runtime.models import run_coroutine

    run_coroutine(server.call("lookup_city", dict(ARGS)))  # opens the session
    started = time.perf_counter()
    for _ in range(n):
        run_coroutine(server.call("lookup_city", dict(ARGS)))
    return (time.perf_counter() - started) * 1000 / n


def durable_per_call_ms(server: MCPServer, n: int) -> float:
    """Mean ms per durable call: one model reply asking for ``n`` calls, on the embedded runtime."""
    from threads_celery import Agent, Permissions, Threads
    from threads_celery.testing import ScriptedModel, calls, say

    def one_reply_of_n_calls() -> Agent:  # a new agent each time: its script is used up by one run
        return Agent(
            f"mcp_bench_{time.monotonic_ns()}",
            "Look it up.",
            ScriptedModel([calls(*[("lookup_city", ARGS)] * n), say("done")]),
            mcp_servers=[server],
            permissions=Permissions.allow_all(),
        )

    with Threads.embedded() as threads:
        warm = threads.start(one_reply_of_n_calls(), "warm up")
        threads.wait(warm.run_id, 300)
        started = time.perf_counter()
        handle = threads.start(one_reply_of_n_calls(), "go")
        run = threads.wait(handle.run_id, 600)
        elapsed = time.perf_counter() - started
        if run.status != "completed":
            raise SystemExit(f"the durable run ended {run.status}: {run.error}")
        return elapsed * 1000 / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=300, help="calls per measurement (default 300)")
    parser.add_argument("--repeat", type=int, default=3, help="measurements of each kind (default 3)")
    parser.add_argument("--no-durable", action="store_true", help="skip the durable calls on the embedded runtime")
    args = parser.parse_args(argv)

    from mcp import Client, StdioServerParameters

    rows: list[tuple[str, list[float], list[float], list[float]]] = []
    stdio = stdio_server()
    params = StdioServerParameters(command=stdio.command or "", args=list(stdio.args), env=stdio.env, cwd=stdio.cwd)
    with http_server_process() as url:
        http = MCPServer("bench-http", url=url, dedup_window_ms=60_000)
        for transport, server, connect in (
            ("stdio", stdio, lambda: Client(params)),
            ("http", http, lambda: Client(url)),
        ):
            sdk: list[float] = []
            ours: list[float] = []
            durable: list[float] = []
            for _ in range(args.repeat):  # alternated, so drift hits both alike
                sdk.append(sdk_per_call_ms(connect, args.n))
                ours.append(threads_per_call_ms(server, args.n))
                if not args.no_durable:
                    durable.append(durable_per_call_ms(server, args.n))
            rows.append((transport, sdk, ours, durable))

    print(f"no-op MCP tool call, ms per call, median of {args.repeat} runs of {args.n}")
    print(f"{'transport':<10}{'sdk session':>13}{'MCPServer.call':>16}{'ratio':>8}{'durable call':>14}")
    verdicts = []
    for transport, sdk, ours, durable in rows:
        ratio = statistics.median(ours) / statistics.median(sdk)
        shown = f"{statistics.median(durable):14.2f}" if durable else f"{'-':>14}"
        print(f"{transport:<10}{statistics.median(sdk):13.3f}{statistics.median(ours):16.3f}{ratio:8.2f}{shown}")
        verdicts.append(f"{transport} {ratio:.2f} {'<=' if ratio <= 1.3 else '>'} 1.3")
    print(
        "spread: "
        + "; ".join(f"{t} sdk {min(s):.3f}-{max(s):.3f}, ours {min(o):.3f}-{max(o):.3f}" for t, s, o, _ in rows)
    )
    print("target: " + ", ".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
