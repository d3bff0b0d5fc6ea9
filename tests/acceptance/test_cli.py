"""The ``threads-celery`` command, run as a user runs it: a subprocess in a fresh directory.

Embedded tests need no services (SQLite and the in-process worker). The PostgreSQL tests use the
``pg_url`` fixture; the broker test also needs Redis and starts a real ``threads-celery worker``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import THREADS_CELERY, ManagedProcess
from threads_celery.store.migrate import head_revision

REPO = Path(__file__).resolve().parents[2]
DEMO = f"{REPO / 'examples' / 'demo.py'}:agent"
RESEARCH = f"{REPO / 'examples' / 'research.py'}:agent"


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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for the embedded tests, so later commands see the runs of earlier ones."""
    return tmp_path_factory.mktemp("cli")


# -- embedded ----------------------------------------------------------------------------------


def test_run_shows_the_tool_calls_and_the_final_answer(workdir: Path) -> None:
    result = cli("run", DEMO, "plan a dinner in Rome", "--approve", cwd=workdir)

    assert result.returncode == 0, explain(result)
    out = result.stdout
    assert 'get_weather(city="Rome", day="tomorrow")' in out
    assert 'book_table(restaurant="Roscioli", city="Rome", time="20:00", party_size=2)' in out
    assert "send_email(" in out and "sent to me@example.com" in out
    assert out.count("✓ approved by cli") == 2  # book_table and send_email asked, --approve said yes
    assert "answer" in out and "Your evening in Rome is planned." in out
    assert "✔ completed" in out
    assert "Traceback" not in result.stderr
    # The unguarded tool ran exactly once, in the directory the command ran in.
    outbox = (workdir / ".threads-celery" / "demo-outbox.jsonl").read_text().splitlines()
    assert len(outbox) == 1 and "Roscioli" in outbox[0]


def test_run_json_prints_one_object_and_runs_list_finds_the_run(workdir: Path) -> None:
    result = cli("run", DEMO, "plan a dinner in Oslo", "--approve", "--json", cwd=workdir)

    assert result.returncode == 0, explain(result)
    payload = json.loads(result.stdout)
    assert payload["status"] == "completed" and payload["timed_out"] is False
    assert payload["error"] is None
    assert payload["output"].startswith("Your evening in Oslo is planned.")
    assert [m["role"] for m in payload["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    called = [c["name"] for m in payload["messages"] for c in m["tool_calls"]]
    assert called == ["get_weather", "book_table", "send_email"]

    listed = cli("runs", "list", "--json", cwd=workdir)
    assert listed.returncode == 0, explain(listed)
    runs = {r["id"]: r for r in json.loads(listed.stdout)}
    assert runs[payload["run_id"]]["status"] == "completed"
    assert runs[payload["run_id"]]["thread_id"] == payload["thread_id"]

    shown = cli("runs", "show", payload["run_id"], cwd=workdir)
    assert shown.returncode == 0, explain(shown)
    assert payload["run_id"] in shown.stdout and "Your evening in Oslo is planned." in shown.stdout


def test_runs_show_shows_the_run_asked_for_not_the_whole_thread(workdir: Path) -> None:
    first = json.loads(cli("run", DEMO, "plan a dinner in Oslo", "--approve", "--json", cwd=workdir).stdout)
    second = cli("run", DEMO, "plan a dinner in Bergen", "--approve", "--json", "--thread", first["thread_id"],
                 cwd=workdir)  # fmt: skip
    assert second.returncode == 0, explain(second)
    run_id = json.loads(second.stdout)["run_id"]
    shown = cli("runs", "show", run_id, cwd=workdir)
    assert shown.returncode == 0, explain(shown)
    assert "Bergen" in shown.stdout and "Oslo" not in shown.stdout, shown.stdout
    # The footer counts this run's turns and calls (4 and 3), not the thread's (8 and 6).
    assert "· 4 model turns · 3 tool calls" in shown.stdout, shown.stdout


def test_a_call_that_needs_approval_stops_a_non_interactive_run_with_exit_3(tmp_path: Path) -> None:
    result = cli("run", DEMO, "plan a dinner in Paris", cwd=tmp_path)

    assert result.returncode == 3, explain(result)
    assert "get_weather" in result.stdout and "awaiting approval" in result.stdout
    assert "--approve" in result.stderr
    assert not (tmp_path / ".threads-celery" / "demo-outbox.jsonl").exists()

    waiting = json.loads(cli("runs", "list", "--json", cwd=tmp_path).stdout)
    assert [r["status"] for r in waiting] == ["awaiting_approval"]
    cancelled = cli("runs", "cancel", waiting[0]["id"], cwd=tmp_path)
    assert cancelled.returncode == 0, explain(cancelled)
    assert "awaiting_approval → aborted" in cancelled.stdout
    shown = json.loads(cli("runs", "show", waiting[0]["id"], "--json", cwd=tmp_path).stdout)
    assert shown["status"] == "aborted" and shown["error"] == "cancelled from the command line"


# -- agents as tools: the research demo, and the thread's event log ------------------------------


@pytest.fixture(scope="module")
def research(workdir: Path) -> dict[str, Any]:
    result = cli("run", RESEARCH, "Compare HTTP/3 and gRPC", "--approve", "--json", cwd=workdir)
    assert result.returncode == 0, explain(result)
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def test_the_research_demo_completes_with_both_research_results_and_the_background_import(
    research: dict[str, Any], workdir: Path
) -> None:
    assert research["status"] == "completed" and research["timed_out"] is False
    results = [m["tool_result"] for m in research["messages"] if m["tool_result"]]
    found = [r["content"] for r in results if r["name"] == "research"]
    assert [f.split(":")[0] for f in found] == ["HTTP/3", "gRPC"]
    assert "runs over QUIC" in found[0] and "Protocol Buffers" in found[1]
    handle = json.loads(next(r["content"] for r in results if r["name"] == "start_import"))
    assert handle["status"] == "running" and handle["run_id"].startswith("agent-tool:")
    assert research["output"].startswith("HTTP/3 vs gRPC:") and handle["run_id"] in research["output"]

    children = research["agent_tool_runs"]
    researchers = [c for c in children if c["agent_type"] == "researcher"]
    assert [c["status"] for c in researchers] == ["completed", "completed"] and not any(
        c["detached"] for c in researchers
    )
    assert all([m["name"] for m in c["milestones"]] == ["sources_read"] for c in researchers)
    assert all(c["progress"]["fraction"] == 1.0 and c["progress"]["phase"] == "reading" for c in researchers)
    [imported] = [c for c in children if c["run_id"] == handle["run_id"]]
    # The command waited for the background import and for its finish to be delivered.
    assert imported["detached"] and imported["status"] == "completed" and "completed" in imported["delivered"]
    assert [m["name"] for m in imported["milestones"]] == ["halfway", "indexed"]
    assert imported["summary"].startswith("Imported 1200 records of protocol-benchmarks")
    delivered = json.loads(next((workdir / ".threads-celery" / "imports").glob("*.json")).read_text())
    assert delivered["run_id"] == handle["run_id"] and delivered["status"] == "completed"  # on_finish ran
    narrated = [m for m in research["messages"] if (m["meta"] or {}).get("source") == "agent-tool-milestone"]
    assert [m["text"] for m in narrated] == ["[import] reached halfway"]


def test_the_research_demo_shows_each_child_run_with_its_progress_bar_and_milestones(workdir: Path) -> None:
    result = cli("run", RESEARCH, "Compare QUIC and TCP", "--approve", cwd=workdir)

    assert result.returncode == 0, explain(result)
    lines = result.stdout.splitlines()

    def line_with(*fragments: str) -> str:
        return next(line for line in lines if all(f in line for f in fragments))

    for topic in ("QUIC", "TCP"):
        row = line_with(f"researcher · {topic}")
        assert "completed" in row and "━" in row and "100%" in row and "◆ sources_read" in row
        assert lines.index(row) > lines.index(line_with(f'research(topic="{topic}")'))  # under its call
    assert "⇢ started import in the background" in result.stdout
    assert "◆ [import] reached halfway" in result.stdout
    imported = line_with("✔ import")
    assert "completed" in imported and "100%" in imported and "◆ halfway" in imported and "◆ indexed" in imported
    assert "QUIC vs TCP:" in result.stdout and "3 child runs" in result.stdout
    assert "Traceback" not in result.stderr


def test_events_replays_a_thread_as_json_lines_from_a_cursor_and_as_a_live_view(
    research: dict[str, Any], workdir: Path
) -> None:
    thread = research["thread_id"]
    replayed = cli("events", thread, "--json", cwd=workdir)
    assert replayed.returncode == 0, explain(replayed)
    events = [json.loads(line) for line in replayed.stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {
        "run",
        "message",
        "agent_tool.started",
        "agent_tool.progress",
        "agent_tool.milestone",
        "agent_tool.finished",
    } <= {e["type"] for e in events}
    handle = next(
        json.loads(e["payload"]["tool_result"]["content"])
        for e in events
        if e["type"] == "message" and (e["payload"].get("tool_result") or {}).get("name") == "start_import"
    )
    fractions = [
        e["payload"]["fraction"]
        for e in events
        if e["type"] == "agent_tool.progress" and e["payload"]["run_id"] == handle["run_id"]
    ]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 1

    cursor = events[len(events) // 2]["seq"]
    resumed = cli("events", thread, "--after", str(cursor), "--json", "--follow", "--timeout", "0.5", cwd=workdir)
    assert resumed.returncode == 0, explain(resumed)
    assert [json.loads(line) for line in resumed.stdout.splitlines()] == events[cursor:]

    view = cli("events", thread, cwd=workdir)
    assert view.returncode == 0, explain(view)
    assert f"▶ thread {thread}" in view.stdout and "research-coordinator" in view.stdout
    assert f"✔ run {research['run_id']} completed" in view.stdout
    assert "researcher · HTTP/3" in view.stdout and "◆ halfway" in view.stdout
    assert f"last event: {events[-1]['seq']}" in view.stdout


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("no_such_module:agent", "cannot import agent module 'no_such_module'"),
        ("missing.py:agent", "no such file"),
        (f"{REPO / 'examples' / 'demo.py'}:get_weather", "'get_weather' in "),
        (
            f"{REPO / 'examples' / 'demo.py'}:agnt",
            f"there is no attribute 'agnt' in {REPO / 'examples' / 'demo.py'} (the Agents it has: agent)",
        ),
    ],
)
def test_a_bad_agent_spec_exits_2_with_one_clear_line(tmp_path: Path, spec: str, expected: str) -> None:
    result = cli("run", spec, "hello", cwd=tmp_path)

    assert result.returncode == 2, explain(result)
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error: ")


def test_an_unknown_run_and_services_that_are_not_configured_exit_2(tmp_path: Path) -> None:
    unknown = cli("runs", "show", "run_nope", cwd=tmp_path)
    assert unknown.returncode == 2, explain(unknown)
    assert "no run has id 'run_nope'" in unknown.stderr

    worker = cli("worker", "--agents", DEMO, cwd=tmp_path)
    assert worker.returncode == 2, explain(worker)
    assert "THREADS_DATABASE_URL and THREADS_BROKER_URL are not set" in worker.stderr
    assert "Traceback" not in worker.stderr


# -- PostgreSQL (and Redis) --------------------------------------------------------------------


def test_db_upgrade_migrates_a_fresh_database_and_db_current_prints_the_head(pg_url: str, tmp_path: Path) -> None:
    before = cli("db", "current", "--database-url", pg_url, cwd=tmp_path)
    assert before.returncode == 0, explain(before)
    assert "(empty)" in before.stdout

    upgraded = cli("db", "upgrade", "--database-url", pg_url, cwd=tmp_path)
    assert upgraded.returncode == 0, explain(upgraded)
    assert f"(empty) → {head_revision()}" in upgraded.stdout

    again = cli("db", "upgrade", cwd=tmp_path, THREADS_DATABASE_URL=pg_url)
    assert again.returncode == 0, explain(again)
    assert f"already at {head_revision()}" in again.stdout

    current = cli("db", "current", cwd=tmp_path, THREADS_DATABASE_URL=pg_url)
    assert current.returncode == 0, explain(current)
    assert current.stdout.strip() == f"{head_revision()} (head)"


def test_db_upgrade_against_an_unreachable_database_exits_2(tmp_path: Path) -> None:
    result = cli("db", "upgrade", "--database-url", "postgresql://nobody@127.0.0.1:1/none", cwd=tmp_path)
    assert result.returncode == 2, explain(result)
    assert "cannot reach the database" in result.stderr and "Traceback" not in result.stderr


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


def test_with_a_database_and_broker_run_enqueues_to_a_real_worker(
    worker_process: dict[str, str], tmp_path: Path
) -> None:
    result = cli(
        "run", DEMO, "plan a dinner in Vienna", "--approve", "--json", "--timeout", "60", cwd=tmp_path, **worker_process
    )

    assert result.returncode == 0, explain(result) + "\n--- worker\n" + (tmp_path / "worker.log").read_text()
    payload = json.loads(result.stdout)
    assert payload["status"] == "completed"
    assert "Gasthaus Pöschl" in payload["output"]

    listed = cli("runs", "list", "--status", "completed", "--json", cwd=tmp_path, **worker_process)
    assert listed.returncode == 0, explain(listed)
    assert [r["id"] for r in json.loads(listed.stdout)] == [payload["run_id"]]


# -- a child run's approval, answered from the parent's command line ---------------------------

CHILD_APPROVAL = f"{REPO / 'tests' / 'support' / 'child_approval_agent.py'}:agent"


@pytest.mark.parametrize("as_json", [False, True], ids=["live", "json"])
def test_run_approve_answers_a_child_runs_pending_approval(tmp_path: Path, as_json: bool) -> None:
    result = cli("run", CHILD_APPROVAL, "go", "--approve", *(["--json"] if as_json else []), cwd=tmp_path)

    assert result.returncode == 0, explain(result)
    assert "✓ approved by cli" in result.stderr and "send_note in child run of child_approval_child" in result.stderr
    if as_json:
        assert json.loads(result.stdout)["status"] == "completed"
    else:
        assert "parent done" in result.stdout
    assert (tmp_path / "child-effects.txt").read_text().splitlines() == ["hello from the child"]


def test_without_approve_a_childs_pending_approval_stops_with_exit_3_and_is_answered_from_the_parent(
    tmp_path: Path,
) -> None:
    started = cli("run", CHILD_APPROVAL, "go", "--json", cwd=tmp_path)
    assert started.returncode == 3, explain(started)
    payload = json.loads(started.stdout)
    assert (payload["status"], payload["timed_out"]) == ("waiting", False)
    listed = cli("parked", "--run", payload["run_id"], "--json", cwd=tmp_path)
    assert listed.returncode == 0, explain(listed)
    [entry] = json.loads(listed.stdout)
    assert (entry["kind"], entry["tool"], entry["agent"]) == ("child", "send_note", "child_approval_child")
    assert not (tmp_path / "child-effects.txt").exists()

    approved = cli("approve", entry["effect_key"], "--principal", "alice", "--agent", CHILD_APPROVAL, cwd=tmp_path)
    assert approved.returncode == 0, explain(approved)
    shown = json.loads(cli("runs", "show", payload["run_id"], "--json", cwd=tmp_path).stdout)
    assert shown["status"] == "completed", shown
    assert (tmp_path / "child-effects.txt").read_text().splitlines() == ["hello from the child"]
