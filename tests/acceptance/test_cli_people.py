"""``parked``, ``approve``, ``deny`` and ``resolve``, run as a user runs them: subprocesses.

Embedded, no worker runs between commands: a decision is recorded, and with ``--agent`` the
command continues the run itself. Against PostgreSQL and Redis a real ``threads-celery worker``
carries on after each decision.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import Result
from typer.testing import CliRunner

from tests.support.processes import THREADS_CELERY, ManagedProcess, free_port
from tests.support.waiting import eventually
from threads_celery.cli.app import app

REPO = Path(__file__).resolve().parents[2]
DEMO = f"{REPO / 'examples' / 'demo.py'}:agent"


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_")}
    env.update({"COLUMNS": "200", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def cli(*args: str, cwd: Path, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "threads_celery.cli.app", *args],
        cwd=cwd,
        env=cli_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


# An agent whose worker dies in the middle of its first charge, after the money moved: the
# call is left started, and the next process that looks at it parks it for a person.
CHARGER = """
import os
from pathlib import Path

from pydantic import BaseModel

from threads_celery import Agent, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import ScriptedModel, call

LEDGER = Path("ledger.txt")
CRASHED = Path("crashed")


class ChargeIn(BaseModel):
    amount: int


def _charge(inp, ctx):
    with LEDGER.open("a") as ledger:
        ledger.write(f"charged {inp.amount} ({ctx.effect_key})\\n")
    if not CRASHED.exists():
        CRASHED.touch()
        os._exit(137)  # like a SIGKILL: after the effect, before the result is committed
    return {"charged": inp.amount}


def _answer(messages):
    for message in reversed(messages):
        for part in getattr(message, "parts", []):
            if getattr(part, "tool_name", None) == "charge":
                return f"charge result: {part.content}"
    return "no result"


agent = Agent(
    name="charger",
    instructions="Charge the card.",
    model=ScriptedModel([call("charge", amount=5), _answer]),
    tools=[tool(name="charge", description="Charge the card.", input=ChargeIn, effect="unguarded", execute=_charge)],
    permissions=Permissions(allow=["charge"]),
)
"""

# The next process that loads the agent: its reconcile tick finds the dead worker's expired lease
# and re-dispatches the call, whose recovery decision (unguarded, started) is to park it.
NOTICE_THE_CRASH = """
import sys, time
sys.path.insert(0, ".")
import charger
from threads_celery import Threads
from threads_celery.settings import Settings

threads = Threads(settings=Settings.from_env(), embedded_path=".threads-celery/embedded.db")
threads.registry.add(charger.agent)
threads.start_worker()
deadline = time.monotonic() + 60
while not [c for c in threads.parked() if c.status == "parked"]:
    assert time.monotonic() < deadline, "the crashed call was never parked"
    threads.reconcile()
    time.sleep(0.1)
threads.close()
"""


def pending(cwd: Path, **env: str) -> list[dict[str, Any]]:
    listed = cli("parked", "--json", cwd=cwd, **env)
    assert listed.returncode == 0, explain(listed)
    calls: list[dict[str, Any]] = json.loads(listed.stdout)
    return calls


def shown(run_id: str, cwd: Path, **env: str) -> dict[str, Any]:
    result = cli("runs", "show", run_id, "--json", cwd=cwd, **env)
    assert result.returncode == 0, explain(result)
    run: dict[str, Any] = json.loads(result.stdout)
    return run


# -- embedded ----------------------------------------------------------------------------------


def test_a_call_awaiting_approval_is_listed_approved_denied_and_the_run_continued_here(tmp_path: Path) -> None:
    started = cli("run", DEMO, "plan a dinner in Paris", "--json", cwd=tmp_path)
    assert started.returncode == 3, explain(started)
    run_id = json.loads(started.stdout)["run_id"]

    [booking] = pending(tmp_path)
    assert booking["status"] == "awaiting_approval" and booking["tool"] == "book_table" and booking["run_id"] == run_id
    assert json.loads(booking["args"])["restaurant"] == "Le Baratin" and booking["attempt"] == 0
    assert "asks for approval" in booking["reason"]
    listed = cli("parked", cwd=tmp_path)
    assert (
        booking["effect_key"] in listed.stdout
        and "book_table" in listed.stdout
        and "awaiting_approval" in listed.stdout
    )
    # At 80 columns the ids the other commands take are printed whole.
    narrow = cli("parked", cwd=tmp_path, COLUMNS="80")
    assert booking["effect_key"] in narrow.stdout and run_id in narrow.stdout, explain(narrow)

    approved = cli("approve", booking["effect_key"], "--principal", "alice", "--agent", DEMO, cwd=tmp_path)
    # The booking ran here; the email then asks for approval in turn: exit 3 again.
    assert approved.returncode == 3, explain(approved)
    assert f"approved {booking['effect_key']} (book_table) as alice" in approved.stdout
    assert "TBL-" in approved.stdout and "send_email(" in approved.stdout and "awaiting approval" in approved.stdout

    [email] = pending(tmp_path)
    assert email["tool"] == "send_email" and email["run_id"] == run_id
    denied = cli("deny", email["effect_key"], "--reason", "no emails today", "--agent", DEMO, cwd=tmp_path)
    assert denied.returncode == 0, explain(denied)
    assert "denied: no emails today" in denied.stdout and "Your evening in Paris is planned." in denied.stdout
    assert "✔ completed" in denied.stdout

    assert pending(tmp_path) == []
    run = shown(run_id, tmp_path)
    assert (
        run["status"] == "completed" and "I could not email you the details (denied: no emails today)" in run["output"]
    )
    results = {m["tool_result"]["name"]: m["tool_result"] for m in run["messages"] if m["tool_result"]}
    assert results["send_email"]["is_error"] and results["send_email"]["content"] == "denied: no emails today"
    assert not (tmp_path / ".threads-celery" / "demo-outbox.jsonl").exists()  # the email never went out

    # A replay says who answered each call, as the live view did.
    replayed = cli("runs", "show", run_id, cwd=tmp_path)
    assert "✓ approved by alice" in replayed.stdout and "✗ denied" in replayed.stdout, explain(replayed)
    followed = cli("events", run["thread_id"], cwd=tmp_path)
    assert "✓ approved by alice" in followed.stdout and "✗ denied" in followed.stdout, explain(followed)
    listed_narrow = cli("runs", "list", cwd=tmp_path, COLUMNS="80")
    assert run_id in listed_narrow.stdout, explain(listed_narrow)


def named_command(text: str, command: str) -> list[str]:
    """The ``threads-celery <command> ...`` a message names, as arguments (up to the closing backquote or the end)."""
    match = re.search(rf"threads-celery {command} [^`\n]*", text)
    assert match is not None, f"no `threads-celery {command}` in:\n{text}"
    return shlex.split(match[0])[1:]


def test_a_parked_run_says_the_command_that_approves_its_call_and_continues_it_here(tmp_path: Path) -> None:
    started = cli("run", DEMO, "plan a dinner in Lisbon", cwd=tmp_path)
    assert started.returncode == 3, explain(started)
    [booking] = pending(tmp_path)
    # The command it names is pasted as it is: it approves and runs the booking here; the email
    # then waits, and that message names the next command, which takes the run to its end.
    command = named_command(started.stderr, "approve")
    assert booking["effect_key"] in command and "--agent" in command, started.stderr
    approved = cli(*command, cwd=tmp_path)
    assert approved.returncode == 3, explain(approved)
    assert "TBL-" in approved.stdout and "send_email(" in approved.stdout
    finished = cli(*named_command(approved.stderr, "approve"), cwd=tmp_path)
    assert finished.returncode == 0, explain(finished)
    assert "Your evening in Lisbon is planned." in finished.stdout and "✔ completed" in finished.stdout
    assert pending(tmp_path) == []


def test_without_agent_an_approval_is_recorded_and_the_command_it_names_continues_the_run(tmp_path: Path) -> None:
    started = cli("run", DEMO, "plan a dinner in Rome", "--json", cwd=tmp_path)
    assert started.returncode == 3, explain(started)
    run_id = json.loads(started.stdout)["run_id"]
    [booking] = pending(tmp_path)

    approved = cli("approve", booking["effect_key"], "--principal", "alice", cwd=tmp_path)
    assert approved.returncode == 0, explain(approved)
    assert "approved" in approved.stdout
    assert pending(tmp_path) == []  # approved: it waits for a worker now, not for a person
    assert shown(run_id, tmp_path)["status"] == "running"
    again = cli("approve", booking["effect_key"], "--principal", "alice", cwd=tmp_path)
    assert again.returncode == 2, explain(again)
    assert (
        again.stderr.startswith("error: ") and "is pending, not awaiting_approval; nothing was changed" in again.stderr
    )

    # The command the message names, with the agent filled in, runs the booking here.
    command = named_command(approved.stderr, "resume")
    assert command[:2] == ["resume", run_id] and command[2:] == ["--agent", "MODULE:AGENT"], approved.stderr
    resumed = cli(*command[:3], DEMO, "--approve", cwd=tmp_path)
    assert resumed.returncode == 0, explain(resumed)
    assert "TBL-" in resumed.stdout and "Your evening in Rome is planned." in resumed.stdout
    run = shown(run_id, tmp_path)
    assert run["status"] == "completed", run
    assert [c["name"] for m in run["messages"] for c in m["tool_calls"]] == ["get_weather", "book_table", "send_email"]


def test_the_same_approval_again_with_agent_continues_the_run_instead_of_refusing(tmp_path: Path) -> None:
    started = cli("run", DEMO, "plan a dinner in Oslo", "--json", cwd=tmp_path)
    run_id = json.loads(started.stdout)["run_id"]
    [booking] = pending(tmp_path)
    assert cli("approve", booking["effect_key"], "--principal", "alice", cwd=tmp_path).returncode == 0

    continued = cli("approve", booking["effect_key"], "--principal", "alice", "--agent", DEMO, cwd=tmp_path)
    # The booking runs here; the email then asks in turn (exit 3).
    assert continued.returncode == 3, explain(continued)
    assert f"{booking['effect_key']} (book_table) was approved already, by alice" in continued.stdout
    assert "TBL-" in continued.stdout and "send_email(" in continued.stdout
    [email] = pending(tmp_path)
    assert email["tool"] == "send_email" and email["run_id"] == run_id
    # A different decision on a call already decided is still refused.
    denied = cli("deny", booking["effect_key"], "--reason", "no", "--agent", DEMO, cwd=tmp_path)
    assert denied.returncode == 2 and "nothing was changed" in denied.stderr, explain(denied)


def test_a_call_approved_through_the_embedded_api_continues_a_run_the_cli_started(tmp_path: Path) -> None:
    started = cli("run", DEMO, "plan a dinner in Madrid", "--json", cwd=tmp_path)
    assert started.returncode == 3, explain(started)
    run_id = json.loads(started.stdout)["run_id"]
    port = free_port()
    api = ManagedProcess(
        "api",
        [THREADS_CELERY, "api", "--embedded", "--port", str(port)],
        env=cli_env(THREADS_API_TOKENS="people-token", THREADS_AGENTS=DEMO),
        log_path=tmp_path / "api.log",
        cwd=tmp_path,
    )
    api.start()
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer people-token"}
    try:
        eventually(lambda: _answers(f"{base}/healthz"), timeout=60, what="the API answering", detail=api.log_tail)

        def approve_the(tool: str) -> None:
            call = eventually(
                lambda: [c for c in httpx.get(f"{base}/v1/runs/{run_id}/pending", headers=auth).json()
                         if c["tool"] == tool and c["status"] == "awaiting_approval"],
                timeout=60, interval=0.2, what=f"{tool} awaiting approval", detail=api.log_tail,
            )[0]  # fmt: skip
            answer = httpx.post(f"{base}/v1/calls/{call['effect_key']}/approve", json={}, headers=auth)
            assert answer.status_code == 200, answer.text

        approve_the("book_table")
        approve_the("send_email")  # asked for only once the booking ran: in the API's worker

        def completed() -> dict[str, Any] | None:
            run: dict[str, Any] = httpx.get(f"{base}/v1/runs/{run_id}", headers=auth).json()
            assert run["status"] not in ("error", "aborted"), run
            return run if run["status"] == "completed" else None

        run = eventually(completed, timeout=60, interval=0.2, what=f"run {run_id} completing", detail=api.log_tail)
        assert "Your evening in Madrid is planned." in run["output"]
    finally:
        api.terminate(timeout=20)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with an embedded database and nothing in it, so that lookups really look."""
    where = tmp_path_factory.mktemp("empty")
    upgraded = cli("db", "upgrade", cwd=where)
    assert upgraded.returncode == 0, explain(upgraded)
    return where


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["approve", "run_nope:0:0", "--principal", "alice"], "no tool call has effect key 'run_nope:0:0'"),
        (["deny", "run_nope:0:0", "--reason", "no"], "no tool call has effect key"),
        (["resolve", "run_nope:0:0", "assume_done", "--principal", "alice"], "no tool call has effect key"),
        (["approve", "k", "--principal", "alice", "--args", "{not json"], "--args is not valid JSON"),
        (["approve", "k", "--principal", "alice", "--args", "[1, 2]"], "--args must be a JSON object"),
        (
            ["approve", "k", "--principal", "alice", "--args", '{"party_size": 4}'],
            "--args is checked against the tool's input",
        ),
        (["approve", "k", "--principal", " "], "--principal must name who decides"),
        (["deny", "k", "--reason", "  "], "--reason must say why"),
        (
            ["resolve", "k", "assume_not_done", "--principal", "alice", "--result", "1"],
            "--result goes with assume_done",
        ),
        (["resolve", "k", "assume_maybe", "--principal", "alice"], "assume_maybe"),
        (["approve", "k"], "Missing option '--principal'"),
        (["events", "thread_nope"], "no thread has id 'thread_nope'"),
    ],
)
def test_a_wrong_decision_exits_2_with_one_clear_line(empty_db: Path, args: list[str], expected: str) -> None:
    # In-process (same code, same exit codes and streams as a subprocess), to keep this table fast.
    result = in_process(*args, "--db", str(empty_db / ".threads-celery" / "embedded.db"))

    assert result.exit_code == 2, f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    assert expected in result.stderr
    assert isinstance(result.exception, SystemExit)  # an exit, not an error escaping the command
    assert "Traceback" not in result.stderr + result.stdout


def test_a_call_parked_after_a_crash_is_resolved_assume_done_or_run_again_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "charger.py").write_text(textwrap.dedent(CHARGER))
    (tmp_path / "notice.py").write_text(textwrap.dedent(NOTICE_THE_CRASH))
    ledger = tmp_path / "ledger.txt"

    def crash_and_park(message: str) -> dict[str, Any]:
        (tmp_path / "crashed").unlink(missing_ok=True)
        crashed = cli("run", "charger.py:agent", message, cwd=tmp_path, THREADS_TOOL_LEASE_S="1")
        assert crashed.returncode == 137, explain(crashed)
        noticed = subprocess.run(
            [sys.executable, "notice.py"],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert noticed.returncode == 0, noticed.stdout + noticed.stderr
        [call] = pending(tmp_path)
        assert call["status"] == "parked" and call["tool"] == "charge" and call["attempt"] == 1
        assert "a person must decide" in call["reason"]
        return call

    first = crash_and_park("charge me")
    done = cli(
        "resolve",
        first["effect_key"],
        "assume_done",
        "--principal",
        "alice",
        "--result",
        '{"charged": 5, "by": "hand"}',
        "--agent",
        "charger.py:agent",
        cwd=tmp_path,
    )
    assert done.returncode == 0, explain(done)
    assert f"resolved {first['effect_key']} (charge) as assume_done by alice" in done.stdout
    assert 'charge result: {"charged":5,"by":"hand"}' in done.stdout and "✔ completed" in done.stdout
    assert "risk of a duplicate" not in done.stderr
    assert ledger.read_text().count(first["effect_key"]) == 1  # assumed done: not charged again

    second = crash_and_park("charge me again")
    again = cli(
        "resolve",
        second["effect_key"],
        "assume_not_done",
        "--principal",
        "bob",
        "--agent",
        "charger.py:agent",
        cwd=tmp_path,
    )
    assert again.returncode == 0, explain(again)
    assert (
        "warning: bob accepts the risk of a duplicate: charge may already have run (attempt 1) and runs again."
        in again.stderr
    )
    assert 'charge result: {"charged":5}' in again.stdout
    assert ledger.read_text().count(second["effect_key"]) == 2  # the duplicate bob accepted
    assert pending(tmp_path) == []


def in_process(*args: str) -> Result:
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("THREADS_")}
    return CliRunner().invoke(app, list(args), env={**unset, "COLUMNS": "200", "NO_COLOR": "1"})


def test_help_of_each_people_command_shows_examples() -> None:
    for command, example in [
        ("parked", "threads-celery parked --json"),
        ("approve", "threads-celery approve run_3f2a...:1:0 --principal alice"),
        ("deny", 'threads-celery deny run_3f2a...:2:0 --reason "no emails on weekends"'),
        ("resolve", "threads-celery resolve run_3f2a...:2:0 assume_not_done --principal alice"),
        ("resume", "threads-celery resume run_3f2a... --agent examples/demo.py:agent"),
        ("events", "threads-celery events thread_9c1e... --follow"),
    ]:
        result = in_process(command, "--help")
        assert result.exit_code == 0, result.output
        assert example in result.stdout


# -- PostgreSQL and Redis, with a real worker ----------------------------------------------------


@pytest.fixture
def worker_process(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {"THREADS_DATABASE_URL": pg_url, "THREADS_BROKER_URL": redis_url}
    upgraded = cli("db", "upgrade", cwd=tmp_path, **env)
    assert upgraded.returncode == 0, explain(upgraded)
    process = ManagedProcess(
        "cli-worker",
        [
            THREADS_CELERY,
            "worker",
            "--agents",
            DEMO,
            "--pool",
            "threads",
            "--concurrency",
            "2",
            "--loglevel",
            "WARNING",
        ],
        env=cli_env(**env),
        log_path=tmp_path / "worker.log",
        cwd=tmp_path,
    )
    process.start()
    try:
        yield env
    finally:
        process.terminate(timeout=20)


def wait_for_call(tool: str, cwd: Path, env: dict[str, str], timeout: float = 60) -> dict[str, Any]:
    found = eventually(
        lambda: [c for c in pending(cwd, **env) if c["tool"] == tool],
        timeout=timeout,
        interval=0.2,
        what=f"a {tool} call waiting for a person",
        detail=lambda: "\n" + (cwd / "worker.log").read_text(),
    )
    return found[0]


def test_with_a_real_worker_each_approval_lets_the_workers_carry_the_run_to_its_end(
    worker_process: dict[str, str], tmp_path: Path
) -> None:
    env = worker_process
    started = cli("run", DEMO, "plan a dinner in Vienna", "--json", "--timeout", "60", cwd=tmp_path, **env)
    assert started.returncode == 3, explain(started) + "\n--- worker\n" + (tmp_path / "worker.log").read_text()
    run_id = json.loads(started.stdout)["run_id"]

    booking = wait_for_call("book_table", tmp_path, env)
    approved = cli("approve", booking["effect_key"], "--principal", "alice", cwd=tmp_path, **env)
    assert approved.returncode == 0, explain(approved)
    assert "the workers carry on" in approved.stderr

    email = wait_for_call("send_email", tmp_path, env)  # the worker ran the booking meanwhile
    assert email["run_id"] == run_id
    assert cli("approve", email["effect_key"], "--principal", "alice", cwd=tmp_path, **env).returncode == 0

    def completed() -> dict[str, Any] | None:
        run = shown(run_id, tmp_path, **env)
        assert run["status"] not in ("error", "aborted"), run
        return run if run["status"] == "completed" else None

    run = eventually(completed, timeout=60, interval=0.2, what=f"run {run_id} completing")
    assert "Gasthaus Pöschl" in run["output"] and "The details are in your inbox." in run["output"]
    outbox = (tmp_path / ".threads-celery" / "demo-outbox.jsonl").read_text().splitlines()
    assert len(outbox) == 1 and "Gasthaus Pöschl" in json.loads(outbox[0])["body"]
