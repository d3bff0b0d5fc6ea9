"""A secret the worker's THREADS_SECRET_KEY cannot open ends its run in error, never a quiet ``completed``.

The thread's secret is sealed with one key; the run then goes on under another (the worker of a
fleet whose keys differ). The tool's call is an error result the thread shows, and the run ends
``error`` with the reason, whether the tool let the exception through or swallowed it. On SQLite
(the embedded default) and on PostgreSQL with a real broker and an in-process worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel

from threads_celery import Agent, Threads, Variable, tool
from threads_celery.testing import ScriptedModel, call, calls, say, start_worker

SEALING_KEY = Fernet.generate_key().decode()
WORKER_KEY = Fernet.generate_key().decode()
SECRET = "sk-live-sealed-elsewhere-0042"


class Empty(BaseModel):
    pass


def _raises(inp: Empty, ctx: Any) -> str:
    return f"connected with {ctx.env('API_KEY')[:2]}"


def _swallows(inp: Empty, ctx: Any) -> str:
    try:
        ctx.env("API_KEY")
    except Exception:  # noqa: BLE001 - the careless tool this test is about
        return "all good"
    return "all good"


def _echo(inp: Empty, ctx: Any) -> str:
    return "echo"


def _agent(execute: Any, *, concurrent: bool = False) -> Agent:
    def first_turn(messages: list[Any]) -> Any:
        # The first run only creates the thread; the second calls the tool (with a sibling, when
        # the calls are concurrent).
        text = str(messages[-1].parts[-1].content) if messages else ""
        if text == "hello":
            return say("hello")
        return calls(("use_key", {}), ("echo", {}), ("echo", {}), ("echo", {})) if concurrent else call("use_key")

    siblings = [tool(name="echo", description="x", input=Empty, effect="read_only", execute=_echo, concurrent=True)]
    return Agent(
        name="key-user",
        instructions="x",
        model=ScriptedModel([first_turn, say("done")]),
        tools=[
            tool(
                name="use_key",
                description="x",
                input=Empty,
                effect="read_only",
                execute=execute,
                variables=[Variable("API_KEY", "secret")],
                concurrent=concurrent,
            ),
            *(siblings if concurrent else []),
        ],
    )


def _run_with_the_other_key(threads: Threads, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_SECRET_KEY", SEALING_KEY)
    first = threads.wait(threads.start(agent, "hello").run_id, timeout=60)
    assert first.status == "completed", first
    threads.set_env(first.thread_id, "API_KEY", SECRET)
    monkeypatch.setenv("THREADS_SECRET_KEY", WORKER_KEY)
    run = threads.wait(threads.start(agent, "go", thread_id=first.thread_id).run_id, timeout=60)

    assert run.status == "error", run
    assert run.error is not None and "'API_KEY'" in run.error and "cannot be decrypted" in run.error
    results = [m.tool_result for m in threads.messages(first.thread_id) if m.tool_result is not None]
    if not agent.tool_named("use_key").concurrent:
        assert len(results) == 1 and results[0].is_error, results
        assert "cannot be decrypted" in results[0].content
    # (A concurrent call's result is kept on its call: the run ended before its group was shown.)
    everything = repr(run) + repr(threads.messages(first.thread_id))
    assert SECRET not in everything
    assert not any(m.text == "done" for m in threads.messages(first.thread_id)), "the model went on"


@pytest.mark.parametrize("execute", [_raises, _swallows], ids=["tool-raises", "tool-swallows"])
def test_sqlite_run_with_an_undecryptable_secret_ends_in_error(
    execute: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Threads.embedded(path=tmp_path / "threads.db") as threads:
        _run_with_the_other_key(threads, _agent(execute), monkeypatch)


@pytest.mark.parametrize("execute", [_raises, _swallows], ids=["tool-raises", "tool-swallows"])
def test_sqlite_concurrent_call_with_an_undecryptable_secret_ends_the_run_in_error(
    execute: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Threads.embedded(path=tmp_path / "threads.db") as threads:
        _run_with_the_other_key(threads, _agent(execute, concurrent=True), monkeypatch)


@contextmanager
def _postgres_threads(pg_url: str, redis_url: str, agent: Agent) -> Iterator[Threads]:
    with Threads(database_url=pg_url, broker_url=redis_url) as threads:
        threads.migrate()
        threads.register(agent)
        with start_worker(threads):
            yield threads


@pytest.mark.parametrize("execute", [_raises, _swallows], ids=["tool-raises", "tool-swallows"])
def test_postgres_run_with_an_undecryptable_secret_ends_in_error(
    execute: Any, pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _agent(execute)
    with _postgres_threads(pg_url, redis_url, agent) as threads:
        _run_with_the_other_key(threads, agent, monkeypatch)
