"""Variables and secrets: declared per tool/agent, given per thread, inherited, encrypted."""

from __future__ import annotations

import logging

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel
from sqlalchemy import select

from threads_celery import Agent, ConfigError, Permissions, Threads, agent_tool, tool
from threads_celery.definitions.variables import Variable, VariableError, resolve
from threads_celery.store import schema
from threads_celery.testing import ScriptedModel, call, say

CANARY = "canary-sk-9f8e7d6c5b4a"


class In(BaseModel):
    q: str


def _search(inp: In, ctx) -> str:
    store = ctx.env("VECTOR_STORE_ID")
    key = ctx.env("API_KEY")
    if inp.q == "leak":
        raise RuntimeError(f"provider rejected key {key}")
    return f"searched {store} with a key of {len(key or '')} chars"


search = tool(
    name="search",
    description="Search indexed docs.",
    input=In,
    effect="read_only",
    execute=_search,
    variables=[
        Variable("VECTOR_STORE_ID", "text", required=True, description="Vector store id"),
        Variable("API_KEY", "secret", required=True, description="Provider key"),
    ],
)


def searcher(name: str, q: str = "docs") -> Agent:
    return Agent(
        name=name, instructions="Search.", model=ScriptedModel([call("search", q=q), say("Found.")]), tools=[search]
    )


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())


def test_values_given_at_start_reach_the_tool_and_secrets_are_encrypted_at_rest() -> None:
    with Threads.embedded() as threads:
        handle = threads.start(searcher("s1"), "find it", env={"VECTOR_STORE_ID": "vs_1", "API_KEY": CANARY})
        run = threads.wait(handle.run_id, 20)
        assert run.status == "completed"
        tool_text = next(m.text for m in threads.messages(run.thread_id) if m.role == "tool")
        assert tool_text == f"searched vs_1 with a key of {len(CANARY)} chars"
        with threads.store.read() as tx:
            stored = {r.name: r.value for r in tx.conn.execute(select(schema.variables))}
        assert stored["VECTOR_STORE_ID"] == "vs_1"
        assert CANARY not in stored["API_KEY"]
        assert threads.env(run.thread_id) == {"VECTOR_STORE_ID": "vs_1", "API_KEY": "***"}


def test_a_missing_required_variable_makes_the_run_wait_holding_no_worker_until_set() -> None:
    with Threads.embedded() as threads:
        handle = threads.start(searcher("s2"), "find it", env={"API_KEY": CANARY})
        run = threads.wait(handle.run_id, 20)
        assert run.status == "awaiting_variable"
        [pending] = threads.parked()
        assert "VECTOR_STORE_ID" in pending.reason
        assert threads.set_env(handle.thread_id, "VECTOR_STORE_ID", "vs_2") == 1
        run = threads.wait(handle.run_id, 20)
        assert run.status == "completed"
        assert "searched vs_2" in next(m.text for m in threads.messages(run.thread_id) if m.role == "tool")


def test_canary_secret_appears_in_no_message_event_log_line_outbox_or_raw_column(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with Threads.embedded() as threads:
        handle = threads.start(searcher("s3", q="leak"), "find it", env={"VECTOR_STORE_ID": "vs", "API_KEY": CANARY})
        run = threads.wait(handle.run_id, 20)
        assert run.status == "completed"
        tool_text = next(m.text for m in threads.messages(run.thread_id) if m.role == "tool")
        assert tool_text == "RuntimeError: provider rejected key ***"  # redacted, not leaked
        dump = []
        with threads.store.read() as tx:
            for table in schema.metadata.sorted_tables:
                dump.extend(str(tuple(row)) for row in tx.conn.execute(select(table)))
        dump.extend(str(e.payload) for e in threads.events(run.thread_id))
    assert not [line for line in dump if CANARY in line]
    assert CANARY not in caplog.text


def test_reading_an_undeclared_variable_is_a_clear_error_the_model_sees() -> None:
    sneaky = tool(name="sneaky", description="x", input=In, effect="read_only", execute=lambda i, c: c.env("OTHER"))
    agent = Agent(name="s4", instructions="x", model=ScriptedModel([call("sneaky", q="x"), say("ok")]), tools=[sneaky])
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(agent, "go").run_id, 20)
        text = next(m.text for m in threads.messages(run.thread_id) if m.role == "tool")
    assert text.startswith("VariableError: variable 'OTHER' is not declared by tool 'sneaky'")


def test_env_for_an_undeclared_name_or_a_secret_without_a_key_is_rejected_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Threads.embedded() as threads:
        agent = searcher("s5")
        with pytest.raises(ConfigError, match="not declared"):
            threads.start(agent, "go", env={"NOPE": "x"})
        monkeypatch.delenv("THREADS_SECRET_KEY")
        with pytest.raises(ConfigError, match="THREADS_SECRET_KEY is not set"):
            threads.start(agent, "go", env={"API_KEY": CANARY})
        assert threads.runs() == []


def test_values_flow_down_to_child_threads_unless_the_child_declares_the_name_scoped() -> None:
    class ChildIn(BaseModel):
        message: str

    def _show(inp: ChildIn, ctx) -> str:
        return f"region={ctx.env('REGION')}"

    show = tool(
        name="show", description="x", input=ChildIn, effect="read_only", execute=_show, variables=[Variable("REGION")]
    )
    inheriting = Agent(
        name="kid", instructions="x", model=ScriptedModel([call("show", message="m"), say("done")]), tools=[show]
    )
    scoped = Agent(
        name="scoped-kid",
        instructions="x",
        model=ScriptedModel([call("show", message="m"), say("done")]),
        tools=[show],
        variables=[Variable("REGION", scoped=True)],
    )
    parent = Agent(
        name="boss",
        instructions="x",
        model=ScriptedModel([call("kid", message="go"), call("scoped_kid", message="go"), say("ok")]),
        tools=[agent_tool(inheriting, "Kid."), agent_tool(scoped, "Scoped kid.")],
        permissions=Permissions.allow_all(),
    )
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(parent, "go", env={"REGION": "eu"}).run_id, 30)
        assert run.status == "completed"
        results = [m.text for m in threads.messages(run.thread_id) if m.role == "tool"]
    assert results == ["done", "done"]
    kids = []
    with Threads.embedded() as threads:  # check the children's own tool results
        run = threads.wait(threads.start(parent, "go", env={"REGION": "eu"}).run_id, 30)
        for row in threads.agent_tool_runs(run.thread_id):
            kids.append((row.agent_type, [m.text for m in threads.messages(row.child_thread_id) if m.role == "tool"]))
    assert kids == [("kid", ["region=eu"]), ("scoped-kid", ["region=None"])]


def test_resolve_walks_up_until_a_value_or_a_scoped_thread() -> None:
    root = ({"X": ("text", "root")}, lambda n: False)
    scoped_mid = ({}, lambda n: n == "X")
    leaf = ({}, lambda n: False)
    assert resolve("X", [leaf, root]) == ("text", "root")
    assert resolve("X", [leaf, scoped_mid, root]) is None
    assert resolve("X", [({"X": ("text", "own")}, lambda n: True), root]) == ("text", "own")


def test_variable_declarations_are_checked() -> None:
    with pytest.raises(ConfigError):
        Variable("bad name")
    with pytest.raises(ConfigError):
        Variable("X", "password")  # type: ignore[arg-type]
    assert issubclass(VariableError, LookupError)


def test_a_secret_cannot_be_read_outside_a_tool() -> None:
    with Threads.embedded(reconcile_interval=None) as threads:
        handle = threads.start(searcher("s6"), "find it", env={"VECTOR_STORE_ID": "vs_6", "API_KEY": CANARY})
        assert threads.get_env(handle.thread_id, "VECTOR_STORE_ID") == "vs_6"
        assert threads.get_env(handle.thread_id, "NOT_SET") is None
        with pytest.raises(VariableError, match="only a tool that declares it") as raised:
            threads.get_env(handle.thread_id, "API_KEY")
        assert CANARY not in str(raised.value)
