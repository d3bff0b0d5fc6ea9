"""The production quick-start, extracted from docs/production.md and run as written.

The block between ``<!-- quickstart:begin -->`` and ``<!-- quickstart:end -->`` is run by bash
(``set -euo pipefail``) from the repository root against the real PostgreSQL and Redis, with the
real worker, Beat, API and Flower it starts. Only what must differ for the test to run next to
other things is changed: the database name, the Redis database, the two ports, the log folder and
Beat's schedule file.
A line that drifts from the code fails here: a command that does not exist, an option renamed, a
body the API refuses, a schedule that does not fire within a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT, ManagedProcess, free_port
from tests.support.services import require_service

BEGIN, END = "<!-- quickstart:begin -->", "<!-- quickstart:end -->"
PAGE = REPO_ROOT / "docs" / "production.md"
# The install, services start, two approvals, the run's events, then up to a minute for the schedule.
RUN_TIMEOUT_S = 300


def quickstart() -> str:
    page = PAGE.read_text()
    assert page.count(BEGIN) == 1 and page.count(END) == 1, f"one quick-start block in {PAGE.name}"
    block = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block.startswith("```bash\n") and block.endswith("\n```"), block[:40]
    return block.removeprefix("```bash\n").removesuffix("\n```") + "\n"


def adapt(script: str, *, database: str, redis_url: str, api_port: int, flower_port: int, logs: Path) -> str:
    """The quick-start's script with the few values a shared machine needs changed, and only those."""
    replacements = [
        ("127.0.0.1:5432/threads\n", f"127.0.0.1:5432/{database}\n"),
        ("-U postgres threads ", f"-U postgres {database} "),
        ("-U postgres -d threads ", f"-U postgres -d {database} "),
        ("redis://127.0.0.1:6379/0\n", f"{redis_url}\n"),
        ("127.0.0.1:8000", f"127.0.0.1:{api_port}"),
        ("--port 8000", f"--port {api_port}"),
        ("127.0.0.1:5555", f"127.0.0.1:{flower_port}"),
        ("--port 5555", f"--port {flower_port}"),
        (".threads-celery/logs", str(logs)),
        # Beat's state file: its default is under the working directory, shared by every run here.
        ("start beat threads-celery beat\n", f"start beat threads-celery beat --schedule {logs}/celerybeat-schedule\n"),
    ]
    for old, new in replacements:
        assert old in script, f"the quick-start no longer contains {old!r}: update this test with it"
        script = script.replace(old, new)
    return script


def test_the_quickstart_has_every_production_step() -> None:
    script = quickstart()
    for step in (
        "createdb ",
        "threads-celery db upgrade",
        "threads-celery worker ",
        "threads-celery beat",
        "threads-celery api ",
        "threads-celery flower ",
        "FLOWER_USER=",
        "/v1/runs",
        "/v1/threads/$THREAD_ID/events",
        "/approve",
        "sched:nightly-report",
        "BATCH_EVERY_S=60",
        "THREADS_SECRET_KEY=",
        "readyz?worker=1",  # ready means a worker answers
        "-n work@%h",
        "THREADS_API_TOKENS=alice@default=",  # a named token: approvals are alice's
        "wait_for ",
    ):
        assert step in script, step


def test_the_approve_body_in_the_quickstart_is_what_the_api_takes() -> None:
    from threads_celery.api.bodies import Approve

    bodies = re.findall(r"-d '(\{[^']*\})' \"\$API/v1/calls/\$KEY/approve\"", quickstart())
    assert len(bodies) == 1
    Approve.model_validate(json.loads(bodies[0]))  # raises on a body the endpoint would answer 422


def test_the_quickstart_runs_as_written(pg_server: Any, redis_url: str, tmp_path: Path) -> None:
    for tool in ("createdb", "curl", "bash"):
        require_service(tool, shutil.which(tool) is not None, f"`{tool}` is not on PATH")
    if (pg_server.host, pg_server.port, pg_server.user) != ("127.0.0.1", 5432, "postgres"):
        pytest.skip("the quick-start names PostgreSQL at postgres@127.0.0.1:5432")
    database = f"tc_test_{uuid.uuid4().hex[:16]}"
    logs = tmp_path / "logs"
    script = adapt(
        quickstart(), database=database, redis_url=redis_url, api_port=free_port(),
        flower_port=free_port(), logs=logs,
    )  # fmt: skip
    path = tmp_path / "quickstart.sh"
    path.write_text("set -euo pipefail\n" + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADS_", "FLOWER_", "BATCH_", "OPENAI_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = ManagedProcess(
        "the quick-start", ["bash", str(path)], env=env, log_path=tmp_path / "quickstart.out", cwd=REPO_ROOT
    )
    proc = script.start().proc
    assert proc is not None
    try:
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            script.kill()
            pytest.fail(f"the quick-start did not finish within {RUN_TIMEOUT_S}s:\n{script.log_text()}\n{_logs(logs)}")
        output = script.log_text()
        assert proc.returncode == 0, f"the quick-start failed:\n{output}\n{_logs(logs)}"
        # The approvals were accepted, the events streamed, the run completed, the schedule fired.
        assert output.count('"decision":"approved"') == 2, output
        # Recorded under the token's principal (alice@default=...); the body names nobody.
        assert re.findall(r"^ (book_table|send_email) +\| alice$", output, flags=re.MULTILINE) == [
            "book_table",
            "send_email",
        ], output
        assert "event: " in output and "id: " in output, output
        runs = [json.loads(line) for line in output.splitlines() if line.startswith(("{", "["))]
        finished = [r for r in runs if isinstance(r, dict) and r.get("agent") == "trip-planner"]
        assert finished and finished[-1]["status"] == "completed", output
        report = runs[-1]
        assert report["id"].startswith("sched:nightly-report:") and report["agent"] == "nightly-report", output
    finally:
        # The services the script started in the background stop warmly first, then whatever lingers.
        script.signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        script.kill()
        with pg_server.connect(autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _logs(folder: Path) -> str:
    if not folder.exists():
        return "(no logs)"
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(folder.glob("*.log")))
