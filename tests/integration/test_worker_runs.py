"""Runs driven by a real ``celery -A tasks worker`` (prefork) on PostgreSQL and Redis.

The test process is the web app: it starts runs by agent name and reads the ledger; the worker
subprocess (see ``conftest.py``) loads the agents of ``agents_for_tests`` and does the work.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.integration.conftest import WorkerProcess
from tests.support.waiting import eventually
from threads_celery.records import Message

WAIT_S = 60.0


def shape(messages: list[Message]) -> list[tuple[str, str]]:
    out = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            out.append(("assistant", "|" + ",".join(c.name for c in m.tool_calls)))
        elif m.role == "tool":
            assert m.tool_result is not None
            out.append(("tool", ("ERROR " if m.tool_result.is_error else "") + m.tool_result.content))
        else:
            out.append((m.role, m.text))
    return out


def wait_for_file(path: Path, timeout: float = WAIT_S) -> None:
    eventually(path.exists, timeout=timeout, interval=0.02, what=f"{path} appearing")


def outbox_keys(threads: Any) -> list[str]:
    with threads.store.read() as tx:
        return tx.outbox_keys()


def test_the_worker_registered_the_agents_it_loaded(threads: Any, worker: WorkerProcess) -> None:
    with threads.store.read() as tx:
        from tests.integration import agents_for_tests

        hashes = {a.name: tx.agent_hash(a.name) for a in agents_for_tests.ALL_AGENTS}
    assert "it_one_step" in hashes and "it_gated" in hashes
    assert hashes == {a.name: a.config_hash() for a in agents_for_tests.ALL_AGENTS}


def test_a_one_step_run_completes(threads: Any) -> None:
    handle = threads.start("it_one_step", "hello")
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    assert run.status == "completed", run.error
    assert run.output == "one step done"
    assert shape(threads.messages(handle.thread_id)) == [("user", "hello"), ("assistant", "one step done")]


def test_a_three_step_run_completes(threads: Any) -> None:
    handle = threads.start("it_three_steps", "add things")
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    assert run.status == "completed", run.error
    assert run.output == "3 and 7"
    messages = threads.messages(handle.thread_id)
    assert shape(messages) == [
        ("user", "add things"),
        ("assistant", "|add"),
        ("tool", '{"sum":3}'),
        ("assistant", "|add"),
        ("tool", '{"sum":7}'),
        ("assistant", "3 and 7"),
    ]
    assert messages[2].tool_result is not None
    assert messages[2].tool_result.call_id == messages[1].tool_calls[0].id


def test_a_twenty_step_run_completes_with_one_key_per_call(threads: Any) -> None:
    handle = threads.start("it_twenty_steps", "count")
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    assert run.status == "completed", run.error
    assert run.output == "counted to 18"
    messages = threads.messages(handle.thread_id)
    keys = [f"{run.id}:{step}:0" for step in range(19)]
    expected: list[tuple[str, str]] = [("user", "count")]
    for i, key in enumerate(keys):
        expected += [("assistant", "|count"), ("tool", f"counted {i} as {key}")]
    expected.append(("assistant", "counted to 18"))
    assert shape(messages) == expected
    assert [c.effect_key for m in messages for c in m.tool_calls] == keys
    assert [m.seq for m in messages] == list(range(len(messages)))


def test_two_runs_on_different_threads_run_at_once(threads: Any, tmp_path: Path) -> None:
    gates = [tmp_path / "gate-a", tmp_path / "gate-b"]
    handles = [threads.start("it_gated", f"gate {gate}") for gate in gates]
    assert handles[0].thread_id != handles[1].thread_id
    try:
        # Both tools are inside at the same time: the two runs truly overlap.
        for gate in gates:
            wait_for_file(Path(f"{gate}.entered"))
        assert [threads.get_run(h.run_id).status for h in handles] == ["running", "running"]
    finally:
        for gate in gates:
            gate.touch()
    for handle, gate in zip(handles, gates, strict=True):
        run = threads.wait(handle.run_id, timeout=WAIT_S)
        assert run.status == "completed", run.error
        assert run.output == "through the gate"
        assert shape(threads.messages(handle.thread_id))[2] == ("tool", f"opened {gate.name}")


def test_a_second_message_on_a_busy_thread_waits_for_the_first_run(threads: Any, tmp_path: Path) -> None:
    first_gate, second_gate = tmp_path / "first", tmp_path / "second"
    second_gate.touch()  # the second run passes at once, when its turn comes
    first = threads.start("it_gated", f"gate {first_gate}")
    try:
        wait_for_file(Path(f"{first_gate}.entered"))
        second = threads.start("it_gated", f"gate {second_gate}", thread_id=first.thread_id)
        assert second.status == "queued"
        assert threads.get_run(second.run_id).status == "queued"
        assert f"gate {second_gate}" not in [m.text for m in threads.messages(first.thread_id)]
    finally:
        first_gate.touch()

    run_a = threads.wait(first.run_id, timeout=WAIT_S)
    run_b = threads.wait(second.run_id, timeout=WAIT_S)
    assert (run_a.status, run_b.status) == ("completed", "completed")
    messages = threads.messages(first.thread_id)
    assert [(m.run_id, *s) for m, s in zip(messages, shape(messages), strict=True)] == [
        (run_a.id, "user", f"gate {first_gate}"),
        (run_a.id, "assistant", "|wait_for_file"),
        (run_a.id, "tool", "opened first"),
        (run_a.id, "assistant", "through the gate"),
        (run_b.id, "user", f"gate {second_gate}"),
        (run_b.id, "assistant", "|wait_for_file"),
        (run_b.id, "tool", "opened second"),
        (run_b.id, "assistant", "through the gate"),
    ]


def test_celery_task_ids_name_the_effect_keys_and_step_keys(threads: Any, worker: WorkerProcess) -> None:
    handle = threads.start("it_three_steps", "add again")
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    assert run.status == "completed", run.error
    effect_keys = [c.effect_key for m in threads.messages(handle.thread_id) for c in m.tool_calls]
    assert effect_keys == [f"{run.id}:0:0", f"{run.id}:1:0"]
    # The worker logs a task when it finishes, which may be just after the commit we saw. A call's
    # task id is its effect key and a token of the publish (a call waiting for a person is
    # published again once answered, as a task of its own); a step's is its key.
    for key in effect_keys:
        worker.wait_for_log(rf"Task threads\.tool add\[{re.escape(key)}~[0-9a-f]{{8}}\] succeeded")
    for step in range(3):
        worker.wait_for_log(rf"Task threads\.step it_three_steps\[{re.escape(f'step:{run.id}:{step}')}\] succeeded")
    # Each call ran as exactly one task: no duplicate delivery did the work twice.
    assert (
        len(re.findall(rf"Task threads\.tool add\[{re.escape(effect_keys[0])}~\w+\] succeeded", worker.log_text())) == 1
    )


def test_task_messages_carry_ids_only(threads: Any, worker: WorkerProcess) -> None:
    handle = threads.start("it_three_steps", "a secret-looking message: sk-live-123")
    run = threads.wait(handle.run_id, timeout=WAIT_S)
    assert run.status == "completed", run.error
    worker.wait_for_log(rf"Task threads\.step it_three_steps\[{re.escape(f'step:{run.id}:2')}\] succeeded")
    assert "sk-live-123" not in worker.log_text()


def test_the_outbox_is_empty_once_runs_complete(threads: Any) -> None:
    handles = [threads.start(agent, "go") for agent in ("it_one_step", "it_three_steps", "it_twenty_steps")]
    for handle in handles:
        assert threads.wait(handle.run_id, timeout=WAIT_S).status == "completed"
    assert outbox_keys(threads) == []


def test_the_worker_survives_the_module(worker: WorkerProcess) -> None:
    # Nothing above crashed or restarted the worker's processes.
    assert worker.alive()
    assert "Traceback" not in worker.log_text()
