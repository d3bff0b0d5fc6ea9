"""No input wedges a run (DESIGN principle 9), on SQLite and on PostgreSQL alike.

Each test gives a run something hostile, from the model or from a tool, and checks that the run
reaches a terminal state with a reason the model or a person can read, that the earlier messages
of the thread are all still there, and that both stores end in the same state. The runs go
through the real Celery worker machinery (the in-process worker on the memory transport) over a
real ledger with its migrations: a SQLite file, or a fresh PostgreSQL database.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import insert, select

from threads_celery import Agent, Permissions, Prompt, Settings, Threads, tool
from threads_celery.exceptions import FenceLost
from threads_celery.records import REPLACEMENT, Run
from threads_celery.runtime import failures, step_commit
from threads_celery.runtime.machine import Runtime
from threads_celery.store import schema
from threads_celery.testing import ScriptedModel, call, say

WAIT_S = 60.0


class TextIn(BaseModel):
    text: str = ""


def _echo(inp: TextIn, ctx: Any) -> str:
    return f"echo {inp.text}"


def _nul_result(inp: TextIn, ctx: Any) -> str:
    return "a\x00b"


def _surrogate_result(inp: TextIn, ctx: Any) -> dict[str, str]:
    return {"value": "x\ud800y"}


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("even the message fails")


def _raise_unprintable(inp: TextIn, ctx: Any) -> str:
    raise Unprintable()


BIG = 5_000_000
LIMIT = 10_000


def _big_result(inp: TextIn, ctx: Any) -> str:
    return "é" + "x" * (BIG - 4) + "é"  # multibyte at both ends: the cut never splits a character


echo = tool(name="echo", description="Echo.", input=TextIn, effect="read_only", execute=_echo)
nul_result = tool(name="nul_result", description="x", input=TextIn, effect="read_only", execute=_nul_result)
surrogate_result = tool(
    name="surrogate_result", description="x", input=TextIn, effect="read_only", execute=_surrogate_result
)
unprintable = tool(name="unprintable", description="x", input=TextIn, effect="read_only", execute=_raise_unprintable)
big_result = tool(name="big_result", description="x", input=TextIn, effect="read_only", execute=_big_result)


class ReviewIn(BaseModel):
    message: str
    files: list[str]


reviewer = Prompt(name="reviewer", instructions="Review.", model=ScriptedModel([say("Reviewed.")]))
review = reviewer.as_tool(input=ReviewIn, init_user_message_property="message", init_attachments_property="files")

DEEP_ARGS = '{"text": ' + "[" * 5000 + "]" * 5000 + "}"
LONG_NAME = "t" * 300


def _agent(name: str, *script: Any, tools: list[Any] | None = None) -> Agent:
    return Agent(
        name=name,
        instructions="x",
        model=ScriptedModel(list(script)),
        tools=tools if tools is not None else [echo, nul_result, surrogate_result, unprintable, review, big_result],
        permissions=Permissions.allow_all(),
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def threads(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Threads]:
    """A runtime over the store named by the parameter, with a real in-process Celery worker."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    settings = Settings(
        files_root=str(tmp_path / "files"), model_retries=1, max_task_failures=3, max_tool_result_bytes=LIMIT
    )
    runtime = Threads(database_url=url, broker_url="memory://", settings=settings, migrate=True, worker_concurrency=2)
    runtime.start_worker(reconcile_interval=0.5)
    try:
        yield runtime
    finally:
        runtime.stop_worker()
        runtime.close()


def run_to_end(threads: Threads, agent: Agent, message: str = "go") -> Run:
    threads.register(agent)
    run = threads.wait(threads.start(agent, message).run_id, WAIT_S)
    assert run.status in ("completed", "error"), (run.status, run.error)
    return run


def tool_texts(threads: Threads, run: Run) -> list[str]:
    return [m.text for m in threads.messages(run.thread_id) if m.role == "tool"]


def assert_history_whole(threads: Threads, run: Run, first_user: str = "go") -> None:
    """Nothing earlier in the thread is lost: the user message and the first call and result."""
    messages = threads.messages(run.thread_id)
    assert [m.seq for m in messages] == list(range(len(messages)))
    assert messages[0].role == "user" and messages[0].text == first_user
    assert messages[1].role == "assistant" and messages[1].tool_calls[0].name == "echo"
    assert messages[2].role == "tool" and messages[2].text == "echo before"


def hostile(name: str, *turns: Any) -> Agent:
    """An agent that first makes a friendly call (history to keep), then the hostile turns."""
    return _agent(name, call("echo", text="before"), *turns)


# -- from a caller -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_a_callers_message_the_ledger_cannot_hold_is_refused_and_writes_nothing(threads: Threads, bad: str) -> None:
    agent = _agent(f"caller_{ord(bad)}", say("ok"))
    threads.register(agent)
    with pytest.raises(ValueError, match="message must not contain"):
        threads.start(agent, f"hi{bad}")
    assert threads.runs() == []


# -- from the model ---------------------------------------------------------------------------


def test_arguments_nested_thousands_deep_are_a_tool_error_the_model_sees(threads: Threads) -> None:
    run = run_to_end(threads, hostile("deep", call("echo", DEEP_ARGS), say("done")))
    assert run.status == "completed" and run.output == "done"
    assert tool_texts(threads, run)[1] == "the arguments are nested too deeply to read; send a flatter JSON object"
    assert_history_whole(threads, run)


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_unstorable_characters_in_model_text_are_replaced_and_the_run_completes(threads: Threads, bad: str) -> None:
    run = run_to_end(threads, hostile(f"text_{ord(bad)}", f"an{bad}swer"))
    assert run.status == "completed"
    assert run.output == f"an{REPLACEMENT}swer"
    assert threads.messages(run.thread_id)[-1].text == f"an{REPLACEMENT}swer"
    assert_history_whole(threads, run)


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_unstorable_characters_in_a_tool_name_are_an_unknown_tool_error(threads: Threads, bad: str) -> None:
    run = run_to_end(threads, hostile(f"name_{ord(bad)}", call(f"ec{bad}ho", text="x"), say("done")))
    assert run.status == "completed" and run.output == "done"
    result = tool_texts(threads, run)[1]
    assert result.startswith(f"unknown tool 'ec{REPLACEMENT}ho'")
    assert threads.messages(run.thread_id)[3].tool_calls[0].name == f"ec{REPLACEMENT}ho"
    assert_history_whole(threads, run)


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_unstorable_characters_in_arguments_reach_the_tool_replaced(threads: Threads, bad: str) -> None:
    # JSON text with the raw character in a string (a model's output is text, not escapes).
    run = run_to_end(threads, hostile(f"args_{ord(bad)}", call("echo", '{"text": "a' + bad + 'b"}'), say("done")))
    assert run.status == "completed" and run.output == "done"
    assert tool_texts(threads, run)[1] == f"echo a{REPLACEMENT}b"
    assert_history_whole(threads, run)


def test_a_tool_name_longer_than_the_ledger_holds_is_an_unknown_tool_error(threads: Threads) -> None:
    run = run_to_end(threads, hostile("long_name", call(LONG_NAME, text="x"), say("done")))
    assert run.status == "completed" and run.output == "done"
    assert tool_texts(threads, run)[1].startswith(f"unknown tool '{'t' * 255}'")
    assert_history_whole(threads, run)


# -- from a tool ------------------------------------------------------------------------------


def test_a_nul_in_a_tool_result_is_replaced(threads: Threads) -> None:
    run = run_to_end(threads, hostile("nul_tool", call("nul_result"), say("done")))
    assert run.status == "completed"
    assert tool_texts(threads, run)[1] == f"a{REPLACEMENT}b"
    assert_history_whole(threads, run)


def test_a_lone_surrogate_in_a_tool_result_is_replaced(threads: Threads) -> None:
    run = run_to_end(threads, hostile("surrogate_tool", call("surrogate_result"), say("done")))
    assert run.status == "completed"
    assert tool_texts(threads, run)[1] == '{"value":"x' + REPLACEMENT + 'y"}'
    assert_history_whole(threads, run)


def test_an_exception_whose_message_cannot_be_rendered_is_a_tool_error(threads: Threads) -> None:
    run = run_to_end(threads, hostile("unprintable_tool", call("unprintable"), say("done")))
    assert run.status == "completed" and run.output == "done"
    assert tool_texts(threads, run)[1] == "Unprintable: <unprintable exception>"
    assert_history_whole(threads, run)


def test_a_prompt_tool_naming_an_attachment_the_parent_lacks_is_a_tool_error(threads: Threads) -> None:
    agent = hostile("attachments", call("reviewer", message="review it", files=["missing.txt"]), say("done"))
    run = run_to_end(threads, agent)
    assert run.status == "completed" and run.output == "done"
    result = tool_texts(threads, run)[1]
    assert result.startswith("cannot hand the attachments to reviewer: FileNotFoundError")
    assert "missing.txt" in result
    assert_history_whole(threads, run)


def test_a_result_over_the_limit_reaches_the_model_shortened_and_is_kept_whole(threads: Threads) -> None:
    seen: list[str] = []

    def after_big(messages: Any) -> str:
        seen.append(messages[-1].parts[0].content)  # what the model was shown
        return "done"

    run = run_to_end(threads, hostile("big_tool", call("big_result"), after_big))
    assert run.status == "completed" and run.output == "done"
    [shown] = seen
    head, _, note = shown.partition("\n\n[result shortened: ")
    assert len(head.encode()) <= LIMIT and head.startswith("éxxx")
    assert (
        note
        == f"it is {BIG} bytes, over the limit of {LIMIT}; only the first {len(head.encode())} bytes are shown. The whole result is kept for the user.]"
    )
    assert tool_texts(threads, run)[1] == shown  # the thread holds what the model saw
    key = threads.messages(run.thread_id)[3].tool_calls[0].effect_key
    whole = threads.tool_result(key)
    assert whole is not None and len(whole.encode()) == BIG and whole.endswith("xé")
    assert threads.tool_result(threads.messages(run.thread_id)[1].tool_calls[0].effect_key) == "echo before"
    assert_history_whole(threads, run)


# -- a task that fails the same way every time -----------------------------------------------


def test_a_tool_task_that_always_fails_ends_the_run_after_the_bound(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries: list[str] = []
    lock = threading.Lock()
    original = Runtime._execute

    def broken(self: Runtime, run: Run, call: Any, agent: Agent, tool: Any, now: Any) -> str:
        if call.tool != "unprintable":
            return original(self, run, call, agent, tool, now)
        with lock:
            tries.append(call.effect_key)
        raise RuntimeError("a bug that happens every time")

    monkeypatch.setattr(Runtime, "_execute", broken)
    run = run_to_end(threads, hostile("poison_tool", call("unprintable"), say("never")))
    assert run.status == "error"
    assert run.error is not None and "failed 3 times in a row" in run.error
    assert "RuntimeError: a bug that happens every time" in run.error
    assert len(tries) == 3 and len(set(tries)) == 1
    [settled] = [c for c in threads.parked()] or [None]
    assert settled is None  # nothing left waiting for a person
    with threads.store.read() as tx:
        assert tx.outbox_keys() == []  # nothing will send the task again
    assert_history_whole(threads, run)


def test_a_tool_task_that_gives_up_after_its_run_moved_on_leaves_the_call_unsettled(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's fence moves between the give-up's read and its end (another worker claimed the
    # run): the call's settling as an error must be rolled back with the run's end, or the run
    # would go on with a failure nobody decided.
    gave_up = threading.Event()

    def broken(self: Runtime, run: Run, call: Any, agent: Agent, tool: Any, now: Any) -> str:
        raise RuntimeError("a bug that happens every time")

    def moved_on(tx: Any, run: Run, **kwargs: Any) -> Any:
        gave_up.set()
        raise FenceLost(run.id, run.fence)

    monkeypatch.setattr(Runtime, "_execute", broken)
    monkeypatch.setattr(failures.runs, "finish", moved_on)
    agent = _agent("moved_on", call("unprintable"), say("never"))
    threads.register(agent)
    handle = threads.start(agent, "go")
    assert gave_up.wait(WAIT_S), "the tool task never gave up"
    [key] = [c.effect_key for m in threads.messages(handle.thread_id) for c in m.tool_calls]
    with threads.store.read() as tx:
        loaded = tx.get_call_and_run(key)
    assert loaded is not None
    call_row, run = loaded
    assert call_row.status not in ("ok", "error") and call_row.result is None, call_row
    assert run.status == "running"


def test_a_step_whose_output_cannot_be_committed_ends_the_run_after_bounded_tries(
    threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    original = step_commit.commit_step

    def refuse(runtime: Runtime, run: Run, fence: int, step: int, agent: Agent, turn: Any, started: Any) -> str:
        if step == 0:
            return original(runtime, run, fence, step, agent, turn, started)
        asked.append(step)
        raise ValueError("the store refused the turn")

    monkeypatch.setattr(step_commit, "commit_step", refuse)
    run = run_to_end(threads, hostile("poison_step", say("never stored")))
    assert run.status == "error"
    assert run.error is not None and "ValueError: the store refused the turn" in run.error
    assert len(asked) == 2  # model_retries=1: the first try and one more
    assert_history_whole(threads, run)


# -- the engine never logs SQL parameters ----------------------------------------------------


def test_a_failed_statement_shows_no_parameters_in_its_error_or_the_logs(
    threads: Threads, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "conversation-text-that-must-not-leak"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Exception) as info, threads.store.transaction() as tx:
        row = {"name": "dup", "config_hash": secret, "description": {"x": secret}, "updated_at": _now()}
        tx.conn.execute(insert(schema.agents).values(**row))
        tx.conn.execute(insert(schema.agents).values(**row))  # the same primary key again
    assert secret not in str(info.value)
    assert secret not in caplog.text
    with threads.store.read() as tx:
        assert tx.conn.execute(select(schema.agents.c.name).where(schema.agents.c.name == "dup")).first() is None


def test_a_task_failing_on_a_statement_logs_no_parameters(
    threads: Threads, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "tool-output-that-must-not-reach-a-log"
    original = Runtime._execute

    def refused_statement(self: Runtime, run: Run, call: Any, agent: Agent, tool: Any, now: Any) -> str:
        if call.tool != "unprintable":
            return original(self, run, call, agent, tool, now)
        with self.store.transaction() as tx:  # a statement the database refuses, carrying conversation text
            row = {"name": "twice", "config_hash": secret, "description": {"x": secret}, "updated_at": now}
            tx.conn.execute(insert(schema.agents).values(**row))
            tx.conn.execute(insert(schema.agents).values(**row))
        return "unreachable"

    monkeypatch.setattr(Runtime, "_execute", refused_statement)
    caplog.set_level(logging.DEBUG)
    run = run_to_end(threads, hostile("sql_in_task", call("unprintable"), say("never")))
    assert run.status == "error" and run.error is not None and "IntegrityError" in run.error
    assert secret not in run.error
    assert "IntegrityError" in caplog.text  # the worker did log the failures ...
    assert secret not in caplog.text  # ... without the statement's parameters
    assert_history_whole(threads, run)


def _now() -> Any:
    from threads_celery.transitions.runs import utcnow

    return utcnow()
