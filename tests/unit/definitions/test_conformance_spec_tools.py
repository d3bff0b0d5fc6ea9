"""spec-tools.md section 8: one test per MUST, named after it."""

from __future__ import annotations

import threading

from pydantic import BaseModel

from threads_celery import Agent, Permissions, Threads, tool
from threads_celery.testing import ScriptedModel, calls, say


class In(BaseModel):
    n: int


ORDER: list[int] = []
SEEN_HISTORY: list[list[str]] = []
LOCK = threading.Lock()


def _record(inp: In, ctx) -> str:
    with LOCK:
        ORDER.append(inp.n)
    if inp.n < 0:
        raise ValueError("negative numbers are not allowed")
    return f"n={inp.n}"


record = tool(name="record", description="Record n.", input=In, effect="read_only", execute=_record)


def _agent(name: str, *script) -> Agent:
    return Agent(
        name=name,
        instructions="x",
        model=ScriptedModel(list(script)),
        tools=[record],
        permissions=Permissions.allow_all(),
    )


def _tool_messages(threads: Threads, thread_id: str) -> list[tuple[str, bool]]:
    return [(m.text, m.tool_result.is_error) for m in threads.messages(thread_id) if m.tool_result is not None]


def test_must_validate_tool_args_against_the_declared_schema() -> None:
    ORDER.clear()
    agent = _agent("c1", calls(("record", {"n": "not a number"}), ("record", {"n": 1, "extra": True})), say("ok"))
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(agent, "go").run_id, 20)
        results = _tool_messages(threads, run.thread_id)
    assert ORDER == []  # the function never ran on invalid arguments
    assert all(is_error for _, is_error in results)
    assert results[0][0].startswith("invalid arguments: n:")
    assert "extra" in results[1][0]


def test_must_execute_local_tools_sequentially_in_the_order_they_were_returned() -> None:
    ORDER.clear()
    agent = _agent("c2", calls(*[("record", {"n": n}) for n in (3, 1, 4, 1, 5, 9, 2, 6)]), say("ok"))
    with Threads.embedded(concurrency=4) as threads:
        run = threads.wait(threads.start(agent, "go").run_id, 30)
        results = _tool_messages(threads, run.thread_id)
    assert ORDER == [3, 1, 4, 1, 5, 9, 2, 6]
    assert [text for text, _ in results] == [f"n={n}" for n in (3, 1, 4, 1, 5, 9, 2, 6)]


def test_must_persist_tool_results_as_messages_before_advancing() -> None:
    SEEN_HISTORY.clear()

    def second_turn(messages):
        # The model's next turn sees every result of the previous turn, already stored.
        SEEN_HISTORY.append(
            [p.content for m in messages for p in m.parts if getattr(p, "part_kind", "") == "tool-return"]
        )
        return say("done")

    agent = _agent("c3", calls(("record", {"n": 1}), ("record", {"n": 2})), second_turn)
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(agent, "go").run_id, 20)
        stored = [m.role for m in threads.messages(run.thread_id)]
    assert stored == ["user", "assistant", "tool", "tool", "assistant"]
    assert SEEN_HISTORY == [["n=1", "n=2"]]


def test_must_persist_tool_errors_as_tool_result_messages_rather_than_halting_execution() -> None:
    agent = _agent("c4", calls(("record", {"n": -1}), ("record", {"n": 7})), say("recovered"))
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(agent, "go").run_id, 20)
        results = _tool_messages(threads, run.thread_id)
    assert run.status == "completed" and run.output == "recovered"
    assert results == [("ValueError: negative numbers are not allowed", True), ("n=7", False)]
