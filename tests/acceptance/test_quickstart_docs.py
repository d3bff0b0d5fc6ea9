"""The documentation's quick starts, run as written.

The production quick-start: the block between ``<!-- quickstart:begin -->`` and
``<!-- quickstart:end -->`` in docs/production.md is run by bash (``set -euo pipefail``) from the
repository root against the real PostgreSQL and Redis, with the real worker, Beat, API and Flower
it starts. Only what must differ for the test to run next to other things is changed: the database
name, the Redis database, the two ports, the log folder and Beat's schedule file.
A line that drifts from the code fails here: a command that does not exist, an option renamed, a
body the API refuses, a schedule that does not fire within a minute.

The first steps: every fenced block of README.md, docs/quickstart.md and docs/installation.md is
run here as a user pastes it, or named in NOT_RUN with the reason; a block added to one of these
pages without either fails. The demo and the install run in a copy of the checkout, in a fresh
``.venv`` whose ``pip install`` finds the dependencies already there (the test's own environment,
seen through a path file) so that nothing is downloaded but the build backend. A model string stays
as written: the ``openai`` provider is pointed at :class:`threads_celery.testing.ProviderEmulator`
by ``OPENAI_BASE_URL`` and a dummy ``OPENAI_API_KEY``, as a user tries an agent without a key.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import threads_celery
from tests.support.processes import REPO_ROOT, ManagedProcess, free_port
from tests.support.services import require_service
from threads_celery.testing import ProviderEmulator

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


# -- the first steps: every block of the front pages ----------------------------------------------

FIRST_STEPS = ("README.md", "docs/quickstart.md", "docs/installation.md")
# Each block is known by its page and a line of it.
DEMO = "threads-celery run examples/demo.py:agent"
LEDGER = "threads-celery runs show RUN_ID"
EXAMPLE = "payments = Payments()"
WITH_A_KEY = "export OPENAI_API_KEY=sk-..."
EMULATOR = "python -m threads_celery.provider_emulator --port 8199 &"
INSTALL = "pip install -e '/path/to/threads-celery[openai]'"
WHEEL = "pip wheel --no-deps --wheel-dir dist /path/to/threads-celery"
CHECK = "threads-celery --help"
RUN = {
    ("README.md", DEMO),
    ("README.md", EXAMPLE),
    ("docs/quickstart.md", DEMO),
    ("docs/quickstart.md", LEDGER),
    ("docs/quickstart.md", EXAMPLE),
    ("docs/quickstart.md", WITH_A_KEY),
    ("docs/quickstart.md", EMULATOR),
    ("docs/installation.md", WHEEL),
    ("docs/installation.md", CHECK),
}
NOT_RUN = {
    ("README.md", "CI=true .venv/bin/python -m pytest -q"): "the package's whole test suite: .ci/run runs this line",
    (
        "docs/installation.md",
        INSTALL,
    ): "the demo's `pip install -e .` of the same checkout; the wheel's install names the extra",
}
# A venv, a pip install and the demo on a loaded two-core machine, with room to spare.
SCRIPT_TIMEOUT_S = 240
CHECKOUT_FILES = ("pyproject.toml", "README.md", "threads_celery", "examples")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str


def page_blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    blocks: list[Block] = []
    lines = (REPO_ROOT / page).read_text().splitlines()
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        if opened is None and line.startswith("```"):
            opened, body = (number, line.removeprefix("```").strip()), []
        elif opened is not None and line.startswith("```"):
            blocks.append(Block(page, opened[0], opened[1], "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{page}:{opened}: a block that does not close"
    return blocks


def block(page: str, marker: str) -> str:
    """The text of the one block of ``page`` that has the line ``marker``."""
    found = [b for b in page_blocks(page) if _has_line(b, marker)]
    assert len(found) == 1, f"{page}: {len(found)} blocks with the line {marker!r}"
    return found[0].text


def _has_line(b: Block, marker: str) -> bool:
    return any(marker in line for line in b.text.splitlines())


def test_every_block_of_the_first_steps_is_run_or_says_why_not() -> None:
    known = RUN | set(NOT_RUN)
    for page in FIRST_STEPS:
        for b in page_blocks(page):
            keys = [key for key in known if key[0] == page and _has_line(b, key[1])]
            assert len(keys) == 1, (
                f"{page}:{b.line}: a {b.lang or 'plain'} block that this test does not run; run it here "
                f"(RUN) or say why not (NOT_RUN):\n{b.text}"
            )
            assert b.lang in {"bash", "python"}, f"{page}:{b.line}: a block in {b.lang!r}"
    for page, marker in known:
        block(page, marker)  # each names one block that is there


def test_the_python_blocks_name_nothing_they_do_not_define(tmp_path: Path) -> None:
    """pyflakes' checks (ruff F): no undefined name (a `payments` never made), no unused import."""
    files = []
    for page in FIRST_STEPS:
        for b in page_blocks(page):
            if b.lang == "python":
                files.append(tmp_path / f"{page.replace('/', '_')}_{b.line}.py")
                files[-1].write_text(b.text)
    assert files
    checked = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F", *map(str, files)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def user_env(*, bin_dir: Path) -> dict[str, str]:
    """A user's shell: ``bin_dir`` first on PATH, none of this project's settings or keys."""
    dropped = ("THREADS_", "OPENAI_", "FLOWER_", "BATCH_", "PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_as_pasted(name: str, script: str, *, cwd: Path, env: dict[str, str], logs: Path) -> str:
    """Run ``script`` in bash (``set -euo pipefail``) and return what it printed; fails on a non-zero exit.
    What it started in the background goes with it."""
    path = logs / f"{name}.sh"
    path.write_text("set -euo pipefail\n" + script)
    process = ManagedProcess(name, ["bash", str(path)], env=env, log_path=logs / f"{name}.out", cwd=cwd)
    proc = process.start().proc
    assert proc is not None
    try:
        try:
            proc.wait(timeout=SCRIPT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not finish within {SCRIPT_TIMEOUT_S}s:\n{process.log_text()}")
        output = process.log_text()
        assert proc.returncode == 0, f"{name} failed (exit {proc.returncode}):\n{script}\n---\n{output}"
        return output
    finally:
        process.kill()


def weather_script(body: dict[str, Any]) -> dict[str, Any]:
    """The model: asks for Paris's weather, then answers with the temperature the tool returned."""
    results = [m for m in body["messages"] if m.get("role") == "tool"]
    if not results:
        return {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    return {"text": f"Paris: {json.loads(results[-1]['content'])['temperature']} degrees."}


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="the example's model string needs the openai extra")
    (tmp_path / "example.py").write_text(block("README.md", EXAMPLE))
    env = user_env(bin_dir=Path(sys.executable).parent)
    with ProviderEmulator(weather_script) as provider:
        env |= {"OPENAI_BASE_URL": provider.base_url, "OPENAI_API_KEY": "test"}
        output = run_as_pasted("readme-example", "python example.py\n", cwd=tmp_path, env=env, logs=tmp_path)
    assert output.strip().splitlines()[-1] == "completed Paris: 21 degrees.", output
    assert [r["model"] for r in provider.requests] == ["gpt-4o-mini", "gpt-4o-mini"]

    # A run that fails prints why, not "error None".
    with ProviderEmulator(lambda body: {"error": "Incorrect API key provided", "status": 401}) as provider:
        env |= {"OPENAI_BASE_URL": provider.base_url}
        output = run_as_pasted("readme-refused", "python example.py\n", cwd=tmp_path, env=env, logs=tmp_path)
    last = output.strip().splitlines()[-1]
    assert last.startswith("error model step 0 failed") and "Incorrect API key provided" in last, output


def test_the_quickstart_agent_runs_with_a_key_and_on_the_emulator(tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="the agent's model string needs the openai extra")
    page = (REPO_ROOT / "docs/quickstart.md").read_text()
    assert "save this as `assistant.py`" in page
    project = tmp_path / "project"
    project.mkdir()
    (project / "assistant.py").write_text(block("docs/quickstart.md", EXAMPLE))
    env = user_env(bin_dir=Path(sys.executable).parent)

    # With a key: here the provider is the emulator, as OPENAI_BASE_URL says.
    with ProviderEmulator(weather_script) as provider:
        keyed = env | {"OPENAI_BASE_URL": provider.base_url}
        output = run_as_pasted(
            "with-a-key", block("docs/quickstart.md", WITH_A_KEY), cwd=project, env=keyed, logs=tmp_path
        )
    assert "completed Paris: 21 degrees." in output, output
    assert re.search(r"^run_\w+\s+completed\s+assistant\s", output, flags=re.MULTILINE), output  # runs list
    assert (project / ".threads-celery" / "embedded.db").exists()

    # Without a key: the block starts the emulator itself, on a port free here.
    script = block("docs/quickstart.md", EMULATOR)
    assert script.count("8199") == 2, script
    output = run_as_pasted("emulator", script.replace("8199", str(free_port())), cwd=project, env=env, logs=tmp_path)
    assert "completed Hello from the provider emulator." in output, output


def test_a_fresh_checkout_installs_and_runs_the_demo_as_written(tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="the install names the openai extra")
    demo = block("README.md", DEMO)
    assert block("docs/quickstart.md", DEMO) == demo
    checkout = tmp_path / "threads-celery"
    for name in CHECKOUT_FILES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            checkout.mkdir(exist_ok=True)
            shutil.copy2(source, checkout / name)
    _seed_venv(checkout / ".venv", tmp_path / "seed")
    env = user_env(bin_dir=Path(sys.executable).parent)

    output = run_as_pasted("demo", demo, cwd=checkout, env=env, logs=tmp_path)
    assert "✔ completed" in output and "3 tool calls" in output, output

    with sqlite3.connect(checkout / ".threads-celery" / "embedded.db") as db:
        ((run_id, thread_id),) = db.execute("SELECT id, thread_id FROM runs").fetchall()
    ledger = block("docs/quickstart.md", LEDGER).replace("RUN_ID", run_id).replace("THREAD_ID", thread_id)
    output = run_as_pasted("ledger", ledger, cwd=checkout, env=env, logs=tmp_path)
    assert output.count(run_id) >= 2 and "trip-planner" in output and "book_table" in output, output

    # docs/installation.md, in a project of its own with the checkout's .venv active.
    project = tmp_path / "project"
    project.mkdir()
    active = user_env(bin_dir=checkout / ".venv" / "bin")
    for name, marker in (("wheel", WHEEL), ("check", CHECK)):
        script = block("docs/installation.md", marker).replace("/path/to/threads-celery", str(checkout))
        output = run_as_pasted(name, script, cwd=project, env=active, logs=tmp_path)
    assert output.strip().splitlines()[-1] == threads_celery.__version__, output
    installed = subprocess.run(
        [str(checkout / ".venv/bin/python"), "-c", "import threads_celery; print(threads_celery.__file__)"],
        capture_output=True, text=True, check=True, cwd=project,
    ).stdout  # fmt: skip
    assert "site-packages" in installed, f"the wheel's copy is the one installed last: {installed}"


def _seed_venv(venv: Path, seed: Path) -> None:
    """A venv without pip that sees this environment's packages, but for pip and threads-celery.

    ``python3 -m venv .venv`` over it puts pip in (ensurepip), and ``pip install -e .`` then finds
    every dependency installed and builds the package alone. A path file adds one folder to
    ``sys.path`` without reading the path files in it, so this environment's own editable install
    is not seen.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    seed.mkdir()
    leave_out = ("pip", "pip-", "threads_celery", "__editable__", "_distutils_hack", "__pycache__")
    for folder in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(folder).iterdir():
            if entry.name.startswith(leave_out) or entry.suffix == ".pth" or (seed / entry.name).exists():
                continue
            (seed / entry.name).symlink_to(entry)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "_seed.pth").write_text(f"{seed}\n")
