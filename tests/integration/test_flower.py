"""Flower shows what runs, and nothing of what the conversation holds.

A real worker (``celery -A tasks worker -E``, Redis broker, PostgreSQL ledger) and a real Flower
(``celery -A tasks flower --basic-auth=...``) run side by side. A run's user message and its
tool's arguments carry a canary string; Flower's task listing must name the tool (through the
task's ``argsrepr``) and the effect key, and must not hold the canary anywhere: task messages
carry ids only, and results are outcomes, not tool output.

A task that did not run its call is listed as what it is: waiting for approval, for a child run,
voided by a lost fence, skipped as a duplicate; and each publish of a call is an entry of its own,
so the attempt that waited for approval keeps its entry when the approved attempt runs.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.signals import before_task_publish

from tests.integration.conftest import TEST_AGENTS
from tests.support.processes import (
    REPO_ROOT,
    THREADS_CELERY,
    ManagedProcess,
    WorkerProcess,
    free_port,
    subprocess_env,
)
from tests.support.waiting import eventually
from threads_celery.transitions import runs

FLOWER_USER, FLOWER_PASSWORD = "flower-user", "flower-pass"
DEADLINE_S = 60.0


#: The agents whose tasks end otherwise than by running, loaded beside the package's test agents.
FLOWER_AGENTS = "tests.integration.flower_agents"


def service_env(database_url: str, broker_url: str) -> dict[str, str]:
    agents = f"{TEST_AGENTS},{FLOWER_AGENTS}"
    return subprocess_env(
        {"THREADS_DATABASE_URL": database_url, "THREADS_BROKER_URL": broker_url, "THREADS_AGENTS": agents}
    )


@pytest.fixture(scope="module")
def worker(
    migrated_pg_url: str, integration_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """Overrides the package's worker: one with task events switched on explicitly (``-E``)."""
    process = WorkerProcess(
        "flower-w1",
        env=service_env(migrated_pg_url, integration_redis_url),
        log_path=tmp_path_factory.mktemp("worker") / "flower-w1.log",
        extra_args=["-E"],
    )
    with process.running():
        yield process


class Flower:
    """A Flower process and a tiny client for its JSON API."""

    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process, self.port = process, port

    def get(self, path: str, *, auth: bool = True) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if auth:
            token = base64.b64encode(f"{FLOWER_USER}:{FLOWER_PASSWORD}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def tasks(self) -> tuple[str, dict[str, Any]]:
        """The raw listing (to search for the canary) and its parsed form."""
        status, text = self.get("/api/tasks")
        assert status == 200, text
        return text, json.loads(text)

    def log_tail(self) -> str:
        return self.process.log_tail(60)


@pytest.fixture(scope="module")
def flower_warmup() -> Any:
    """The agent whose runs show that Flower lists the worker's tasks (loaded in the module's worker)."""
    from tests.integration.agents_for_tests import one_step

    return one_step


@pytest.fixture(scope="module")
def flower(
    worker: WorkerProcess,
    threads: Any,
    flower_warmup: Any,
    migrated_pg_url: str,
    integration_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Flower]:
    pytest.importorskip("flower")
    port = free_port()
    # Started the way docker-compose and the README start it: our launcher, credentials from the environment.
    env = service_env(migrated_pg_url, integration_redis_url)
    env.update(FLOWER_USER=FLOWER_USER, FLOWER_PASSWORD=FLOWER_PASSWORD)
    process = ManagedProcess(
        "flower",
        [THREADS_CELERY, "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env,
        log_path=tmp_path_factory.mktemp("flower") / "flower.log",
    )
    process.start()
    flower = Flower(process, port)

    def answers() -> bool:
        assert process.alive(), f"flower exited:\n{flower.log_tail()}"
        try:
            return flower.get("/healthcheck", auth=False)[0] == 200  # open, as the compose health check needs
        except OSError:
            return False

    try:
        eventually(answers, timeout=DEADLINE_S, what="flower answering", detail=flower.log_tail)
        listening(flower, threads, flower_warmup)
        yield flower
    finally:
        process.terminate()


def listening(flower: Flower, threads: Any, agent: Any) -> None:
    """Wait until Flower sees the workers' tasks: runs of ``agent`` until one of them is listed.

    Workers send no task events by default (THREADS_TASK_EVENTS); Flower turns them on itself,
    every few seconds, and sees only the tasks that run after that.
    """
    runs: list[str] = []

    def a_run_listed() -> bool:
        runs.append(run_and_wait(threads, flower, agent, "warm up").id)
        _, listing = flower.tasks()
        return any(listing.get(f"step:{run_id}:0", {}).get("state") == "SUCCESS" for run_id in runs)

    eventually(a_run_listed, timeout=DEADLINE_S, interval=1.0, what="Flower listing a run", detail=flower.log_tail)


def wait_for_task(flower: Flower, task_id: str, *, state: str = "SUCCESS") -> dict[str, Any]:
    def task_in_state() -> dict[str, Any] | None:
        _, listing = flower.tasks()
        task: dict[str, Any] | None = listing.get(task_id)
        return task if task is not None and task.get("state") == state else None

    return eventually(
        task_in_state,
        timeout=DEADLINE_S,
        interval=0.2,
        what=f"task {task_id} {state} in Flower",
        detail=lambda: f"{flower.tasks()[1].get(task_id)}\n{flower.log_tail()}",
    )


def run_and_wait(threads: Any, flower: Flower, agent: Any, message: str) -> Any:
    handle = threads.start(agent, message)
    run = threads.wait(handle.run_id, DEADLINE_S)
    assert run.status == "completed", (run.status, run.error)
    return run


def test_flower_needs_its_basic_auth(flower: Flower) -> None:
    status, _ = flower.get("/api/tasks", auth=False)
    assert status == 401


def test_flower_metrics_need_the_same_basic_auth(flower: Flower) -> None:
    """Flower alone serves /metrics to anyone; behind our launcher it asks for the credentials."""
    status, _ = flower.get("/metrics", auth=False)
    assert status == 401
    status, text = flower.get("/metrics")
    assert status == 200 and "flower_" in text
    assert flower.get("/healthcheck", auth=False)[0] == 200  # the health probe stays open


def test_flower_refuses_to_start_with_empty_credentials(migrated_pg_url: str, integration_redis_url: str) -> None:
    env = service_env(migrated_pg_url, integration_redis_url)
    env.update(FLOWER_USER="", FLOWER_PASSWORD="")
    done = subprocess.run(
        [THREADS_CELERY, "flower", f"--port={free_port()}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S,
    )  # fmt: skip
    assert done.returncode != 0
    assert "FLOWER_USER and FLOWER_PASSWORD" in done.stderr + done.stdout


def test_flower_names_the_tool_and_the_effect_key_and_never_the_conversation(
    flower: Flower, threads: Any, tmp_path: Path
) -> None:
    from tests.integration.agents_for_tests import gated

    canary = f"canary-{uuid.uuid4().hex}"
    gate = tmp_path / f"gate-{canary}"
    gate.touch()  # open already: the tool returns at once
    # This process publishes the run's first step: catch the real message on its way out.
    published: list[tuple[dict[str, Any], Any]] = []

    def catch(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
        published.append((dict(headers or {}), body))

    before_task_publish.connect(catch, weak=False)
    try:
        # The canary is in the user message, and so in the tool's arguments: wait_for_file(path=gate).
        run = run_and_wait(threads, flower, gated, f"gate {gate}")
    finally:
        before_task_publish.disconnect(catch)
    [(headers, body)] = [(h, b) for h, b in published if h.get("id") == f"step:{run.id}:0"]
    assert headers["task"] == "threads.step" and list(body[0]) == [run.id, 0] and body[1] == {}
    assert canary not in json.dumps([headers, body], default=str)
    [call] = [c for m in threads.messages(run.thread_id) for c in m.tool_calls]
    assert call.name == "wait_for_file" and canary in call.args  # the ledger has it, as it should

    [(task_id, task)] = wait_for_entries(flower, "wait_for_file", call.effect_key, ["SUCCESS"]).items()
    assert task["name"] == "threads.tool wait_for_file"  # Celery's shadow name: the task and what it runs
    assert task_id.startswith(f"{call.effect_key}~")  # the effect key, and which publish of the call
    # Flower shows argsrepr: the tool's name and the effect key, and nothing else.
    assert task["args"] == f"('wait_for_file', {call.effect_key})"
    assert task["kwargs"] in ("{}", {}, None)
    step = wait_for_task(flower, f"step:{run.id}:0")
    assert step["name"] == "threads.step it_gated" and "it_gated" in step["args"]

    text, listing = flower.tasks()
    assert {f"step:{run.id}:0", task_id, f"step:{run.id}:1"} <= set(listing)
    assert canary not in text
    for task_id in listing:
        status, detail = flower.get(f"/api/task/info/{task_id}")
        assert status == 200 and canary not in detail


# -- what the list says of a task that did not run its call ---------------------------------------


@pytest.fixture(scope="module")
def waiting_agents(threads: Any) -> Any:
    """The client, with the agents whose calls wait, for a person or for a child, registered."""
    from tests.integration import flower_agents

    for agent in flower_agents.ALL_AGENTS:
        threads.register(agent)
    return threads


def entries_of(flower: Flower, tool: str, effect_key: str) -> dict[str, dict[str, Any]]:
    """Flower's entries of the tasks that carried the call ``effect_key``, by task id: what a
    person finds by searching Flower for the effect key (each entry's args name it)."""
    _, listing = flower.tasks()
    return {task_id: task for task_id, task in listing.items() if task.get("args") == f"({tool!r}, {effect_key})"}


def wait_for_entries(flower: Flower, tool: str, effect_key: str, states: list[str]) -> dict[str, dict[str, Any]]:
    """The call's entries once Flower lists exactly one in each of ``states`` (oldest first)."""

    def listed() -> dict[str, dict[str, Any]] | None:
        entries = entries_of(flower, tool, effect_key)
        in_order = sorted(entries.values(), key=lambda t: t.get("received") or 0)
        return entries if [t.get("state") for t in in_order] == states else None

    return eventually(
        listed,
        timeout=DEADLINE_S,
        interval=0.2,
        what=f"Flower listing {effect_key} as {states}",
        detail=lambda: f"{entries_of(flower, tool, effect_key)}\n{flower.log_tail()}",
    )


def test_a_call_awaiting_approval_reads_so_and_its_run_after_approval_is_an_entry_of_its_own(
    flower: Flower, waiting_agents: Any
) -> None:
    threads = waiting_agents
    handle = threads.start("it_flower_mailer", "email ann")
    run = threads.wait(handle.run_id, DEADLINE_S)
    assert run.status == "awaiting_approval", (run.status, run.error)
    [pending] = [p for p in threads.parked() if p.run_id == run.id]
    assert pending.tool == "send_email"

    [(held_id, held)] = wait_for_entries(flower, "send_email", pending.effect_key, ["AWAITING_APPROVAL"]).items()
    assert held["name"] == "threads.tool send_email"
    assert str(held["result"]).startswith("'awaiting approval: ")  # what it waits for, not a tool result
    assert held_id.startswith(f"{pending.effect_key}~")  # searchable by the effect key
    status, text = flower.get("/api/tasks?state=AWAITING_APPROVAL")  # Flower filters by the state
    assert status == 200 and held_id in json.loads(text)

    threads.approve(pending.effect_key, principal="tester")
    assert threads.wait(run.id, DEADLINE_S).status == "completed"
    entries = wait_for_entries(flower, "send_email", pending.effect_key, ["AWAITING_APPROVAL", "SUCCESS"])
    # The attempt that waited keeps its entry, as it was; the one that sent the email has its own.
    assert entries[held_id]["state"] == "AWAITING_APPROVAL" and entries[held_id]["result"] == held["result"]
    [(ran_id, ran)] = [(task_id, task) for task_id, task in entries.items() if task_id != held_id]
    assert ran_id.startswith(f"{pending.effect_key}~") and ran["result"] == "'completed'"

    # A delivery of the call after it settled (the backbone's copy of a message it thought lost)
    # does nothing, and says so in an entry of its own.
    threads.publisher([runs.tool_entry(pending.effect_key, "send_email", None)])
    entries = wait_for_entries(flower, "send_email", pending.effect_key, ["AWAITING_APPROVAL", "SUCCESS", "SKIPPED"])
    assert (entries[ran_id]["state"], entries[ran_id]["result"]) == ("SUCCESS", "'completed'")
    [skipped] = [task for task_id, task in entries.items() if task_id not in (held_id, ran_id)]
    assert skipped["result"] == "'skipped: run is completed'"


def test_a_call_waiting_for_its_child_run_reads_waiting(flower: Flower, waiting_agents: Any) -> None:
    threads = waiting_agents
    run = threads.wait(threads.start("it_flower_parent", "ask the child").run_id, DEADLINE_S)
    assert run.status == "completed", (run.status, run.error)
    [call] = [c for m in threads.messages(run.thread_id) for c in m.tool_calls]
    [(_, waiting)] = wait_for_entries(flower, "ask_child", call.effect_key, ["WAITING"]).items()
    assert str(waiting["result"]).startswith("'waiting on it_flower_child (")  # the child's run id follows


def test_an_attempt_whose_run_was_taken_over_reads_voided(flower: Flower, threads: Any, tmp_path: Path) -> None:
    """The run's fence moves while the call runs (as when the backbone hands the run to another
    worker): the attempt's result is refused, and its entry says it was voided."""
    gate = tmp_path / "gate"
    handle = threads.start("it_gated", f"gate {gate}")
    run_id = handle.run_id
    eventually(Path(f"{gate}.entered").exists, timeout=DEADLINE_S, what="the gated tool started")
    with threads.store.transaction() as tx:
        current = tx.get_run(run_id)
        assert current is not None and tx.advance_run(run_id, fence=current.fence, now=runs.utcnow()) is not None
    gate.touch()
    [call] = [c for m in threads.messages(handle.thread_id) for c in m.tool_calls]
    [(_, voided)] = wait_for_entries(flower, "wait_for_file", call.effect_key, ["VOIDED"]).items()
    assert voided["result"] == "'fence lost'"
