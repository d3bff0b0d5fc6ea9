"""docs/fastapi.md and docs/own-celery-app.md run as written: every block of each page is run here.

The page's files (each block that opens with ``# <name>.py``) are written as they are into a
folder, and its shell blocks run there on PostgreSQL and Redis: the ledger's migration, a real
worker of the page's agents, uvicorn serving ``shop_app:app``, and the page's curl commands (on
a free port in place of 8000, the one change made). The mounted and Starlette variants are served
in this process; the example's quick try runs embedded, with no services. Every python block also
passes pyflakes' checks (ruff F).

docs/own-celery-app.md's files (``proj/celery.py``, ``proj/tasks.py``) go into a Django project
named ``proj`` whose settings, agents and order functions the test writes (the page takes them
as the project's own); its worker and Beat start by the page's own lines, with this test's
database and broker in place of the page's placeholders, and the page's task starts a run whose
end calls the project's task back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.processes import REPO_ROOT, ManagedProcess, free_port, subprocess_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

PAGE = "docs/fastapi.md"
WAIT_S = 60.0
#: Every shell block of the page, by a line it holds: run by the test named.
SHELL_BLOCKS = {
    "uvicorn shop_app:app --port 8000": "test_the_shop_app_runs_as_written",
    "curl -s -X POST localhost:8000/orders": "test_the_shop_app_runs_as_written",
    "python -m examples.fastapi_app": "test_the_examples_quick_try_runs_embedded_as_written",
}
#: Every file block of the page: run by the test named.
FILE_BLOCKS = {
    "shop_auth.py": "test_the_shop_app_runs_as_written",
    "shop_agents.py": "test_the_shop_app_runs_as_written",
    "shop_app.py": "test_the_shop_app_runs_as_written",
    "shop_mounted.py": "test_the_mounted_and_starlette_variants_serve_as_written",
    "shop_starlette.py": "test_the_mounted_and_starlette_variants_serve_as_written",
}


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    text: str

    @property
    def file_name(self) -> str | None:
        first = self.text.splitlines()[0] if self.text else ""
        found = re.fullmatch(r"# (\S+\.py)", first.strip())
        return found.group(1) if found else None


def page_blocks(page: str = PAGE) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    blocks: list[Block] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate((REPO_ROOT / page).read_text().splitlines(), start=1):
        if opened is None and line.startswith("```"):
            opened, body = (number, line.removeprefix("```").strip()), []
        elif opened is not None and line.startswith("```"):
            blocks.append(Block(opened[0], opened[1], "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{page}:{opened}: a block that does not close"
    return blocks


def shell_block(marker: str) -> str:
    [found] = [b.text for b in page_blocks() if b.lang == "bash" and marker in b.text]
    return found


def write_files(folder: Path) -> None:
    """The page's file blocks, as they are, into ``folder``."""
    for block in page_blocks():
        if block.file_name is not None:
            (folder / block.file_name).write_text(block.text)


def test_every_block_of_the_page_is_run() -> None:
    for block in page_blocks():
        if block.lang == "python":
            assert block.file_name in FILE_BLOCKS, f"{PAGE}:{block.line}: a python block this test does not run"
        elif block.lang == "bash":
            markers = [m for m in SHELL_BLOCKS if m in block.text]
            assert len(markers) == 1, f"{PAGE}:{block.line}: a shell block this test does not run:\n{block.text}"
        else:
            pytest.fail(f"{PAGE}:{block.line}: a {block.lang or 'plain'} block this test does not run")
    for marker in SHELL_BLOCKS:
        shell_block(marker)  # each is on the page, once


def test_the_python_blocks_pass_pyflakes(tmp_path: Path) -> None:
    write_files(tmp_path)
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--no-cache", "--isolated", "--select", "F", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def services_env(migrated_pg_url: str, integration_redis_url: str) -> dict[str, str]:
    env = subprocess_env({"THREADS_DATABASE_URL": migrated_pg_url, "THREADS_BROKER_URL": integration_redis_url})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def json_values(text: str) -> list[Any]:
    """The JSON values printed one after another (curl -s prints no newline between them)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
    return values


@pytest.fixture
def shop(tmp_path: Path, services_env: dict[str, str]) -> Iterator[str]:
    """The page's first shell block, as written but for the port, in a folder of the page's files."""
    write_files(tmp_path)
    port = free_port()
    script = shell_block("uvicorn shop_app:app").replace("--port 8000", f"--port {port}")
    process = ManagedProcess("docs-shop", ["bash", "-ec", script], env=services_env, log_path=tmp_path / "shop.log")
    process.cwd = tmp_path
    base = f"http://127.0.0.1:{port}"
    process.start()
    try:

        def up() -> bool:
            assert process.alive(), f"the page's commands exited:\n{process.log_tail()}"
            try:
                return httpx.get(f"{base}/agents/v1/runs", timeout=2).status_code == 401
            except httpx.TransportError:
                return False

        eventually(up, timeout=WAIT_S, what="the page's app answers")
        yield base
    finally:
        process.terminate()


def test_the_shop_app_runs_as_written(shop: str, tmp_path: Path, services_env: dict[str, str]) -> None:
    port = shop.rsplit(":", 1)[1]
    script = shell_block("curl -s -X POST").replace("localhost:8000", f"localhost:{port}")
    done = subprocess.run(["bash", "-ec", script], env=services_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    placed, listed, refused = json_values(done.stdout)
    assert placed["id"].startswith("ord_") and placed["run_id"] in [r["id"] for r in listed]
    assert refused == {"error": {"type": "unauthorized", "message": "send your API key in X-API-Key"}}
    alice, bob = {"X-API-Key": "key-alice"}, {"X-API-Key": "key-bob"}
    run_url = f"{shop}/agents/v1/runs/{placed['run_id']}"
    eventually(lambda: httpx.get(run_url, headers=alice).json()["status"] == "completed", timeout=WAIT_S, what="run")
    assert httpx.get(run_url, headers=bob).status_code == 404
    messages = httpx.get(f"{shop}/agents/v1/threads/{placed['thread_id']}/messages", headers=alice).json()
    assert messages[-1]["text"] == "Thank you, your order is confirmed."
    assert httpx.get(f"{shop}/console/", auth=("carol", "carol-password")).status_code == 200
    assert httpx.get(f"{shop}/console/").status_code == 401


@pytest.fixture
def page_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_pg_url: str, integration_redis_url: str
) -> Iterator[Path]:
    """The page's files importable in this process, on the test's PostgreSQL and Redis."""
    write_files(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("THREADS_DATABASE_URL", migrated_pg_url)
    monkeypatch.setenv("THREADS_BROKER_URL", integration_redis_url)
    names = [b.file_name.removesuffix(".py") for b in page_blocks() if b.file_name is not None]
    yield tmp_path
    for name in names:
        module = sys.modules.pop(name, None)
        threads = getattr(module, "threads", None)
        if threads is not None:
            threads.close()


def test_the_mounted_and_starlette_variants_serve_as_written(page_modules: Path) -> None:
    import shop_mounted  # type: ignore[import-not-found]  # the page's file, written by the fixture
    import shop_starlette  # type: ignore[import-not-found]  # as above

    alice = {"X-API-Key": "key-alice"}
    with TestClient(shop_mounted.app) as client:
        assert client.get("/agents/healthz").status_code == 200
        assert client.get("/agents/v1/runs", headers=alice).status_code == 200
        refused = client.get("/agents/v1/runs", headers={"X-API-Key": "nope"})
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "unauthorized"
        assert client.get("/agents/console/", headers=alice).status_code == 200
    with TestClient(shop_starlette.app) as client:
        assert client.get("/agents/v1/runs", headers=alice).status_code == 200
        assert client.get("/agents/console/", headers=alice).status_code == 404  # console=False
        assert client.get("/staff/", auth=("carol", "carol-password")).status_code == 200
        assert client.get("/staff/").status_code == 401


def test_the_examples_quick_try_runs_embedded_as_written(tmp_path: Path) -> None:
    """``python -m examples.fastapi_app`` with no services: SQLite in ./.threads-celery."""
    port = free_port()
    env = subprocess_env({"PORT": str(port)})
    command = shell_block("python -m examples.fastapi_app").split("#")[0].split()
    assert command == ["python", "-m", "examples.fastapi_app"]
    process = ManagedProcess("docs-quick-try", [sys.executable, *command[1:]], env=env, log_path=tmp_path / "try.log")
    process.cwd = tmp_path
    base = f"http://127.0.0.1:{port}"
    process.start()
    try:

        def up() -> bool:
            assert process.alive(), f"the quick try exited:\n{process.log_tail()}"
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        eventually(up, timeout=WAIT_S, what="the quick try answers")
        alice = {"X-API-Key": "key-alice"}
        placed = httpx.post(f"{base}/orders", json={"item": "blue mug", "quantity": 1}, headers=alice)
        assert placed.status_code == 201, placed.text
        run_url = f"{base}/agents/v1/runs/{placed.json()['run_id']}"
        eventually(
            lambda: httpx.get(run_url, headers=alice).json()["status"] == "completed", timeout=WAIT_S, what="run"
        )
        assert (tmp_path / ".threads-celery" / "shop.db").is_file()
        assert httpx.get(f"{base}/docs").status_code == 200
    finally:
        process.terminate()


# -- docs/own-celery-app.md ----------------------------------------------------------------------

OWN_APP_PAGE = "docs/own-celery-app.md"
#: What the page takes as the project's own (a Django project named proj): its settings, its
#: agents and the functions its task calls. Written beside the page's files, never over one.
PROJECT_FILES = {
    "proj/__init__.py": "",
    "proj/settings.py": (
        'SECRET_KEY = "docs-test"\n'
        'INSTALLED_APPS = ["proj"]  # so that autodiscover_tasks() finds proj/tasks.py\n'
        "USE_TZ = True\n"
        'CELERY_BROKER_URL = "{broker}"\n'
        'CELERY_TASK_DEFAULT_QUEUE = "proj"\n'
    ),
    "proj/agents.py": (
        "from threads_celery import Agent\n"
        "from threads_celery.testing import ScriptedModel\n\n"
        'reviewer = Agent(name="reviewer", instructions="Review.", model=ScriptedModel(["Looks good."]))\n'
    ),
    "proj/orders.py": (
        "import json\nimport os\n\n\n"
        "def save_review(order_id, output):\n"
        '    with open(os.environ["REVIEWS_FILE"], "a") as f:\n'
        '        f.write(json.dumps({"order": order_id, "review": output}) + "\\n")\n\n\n'
        "def flag_for_a_person(order_id, status, error):\n"
        '    with open(os.environ["REVIEWS_FILE"], "a") as f:\n'
        '        f.write(json.dumps({"order": order_id, "flagged": status, "error": error}) + "\\n")\n'
    ),
}
OWN_APP_SHELL = "celery -A proj worker"


def own_app_blocks() -> list[Block]:
    return page_blocks(OWN_APP_PAGE)


def test_every_block_of_the_own_app_page_is_run() -> None:
    names = []
    for block in own_app_blocks():
        if block.lang == "python":
            assert block.file_name is not None, f"{OWN_APP_PAGE}:{block.line}: a python block that names no file"
            assert block.file_name not in PROJECT_FILES, f"{OWN_APP_PAGE}:{block.line}: the test writes that file"
            names.append(block.file_name)
        else:
            assert block.lang == "bash" and OWN_APP_SHELL in block.text, f"{OWN_APP_PAGE}:{block.line}: not run"
    assert sorted(names) == ["proj/celery.py", "proj/tasks.py"]


def test_the_own_app_pages_python_blocks_pass_pyflakes(tmp_path: Path) -> None:
    for block in own_app_blocks():
        if block.file_name is not None:
            target = tmp_path / block.file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--no-cache", "--isolated", "--select", "F", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_own_app_page_runs_as_written(
    tmp_path: Path, migrated_pg_url: str, integration_redis_url: str, services_env: dict[str, str]
) -> None:
    """The page's proj/celery.py and proj/tasks.py in a Django project, its worker and Beat
    started by its own lines, and its task: a run started from a task of the project's, whose
    end calls the project's task back with the outcome."""
    for name, text in PROJECT_FILES.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace("{broker}", integration_redis_url))
    for block in own_app_blocks():
        if block.file_name is not None:
            (tmp_path / block.file_name).write_text(block.text)
    [shell] = [b.text for b in own_app_blocks() if b.lang == "bash"]
    lines = [line.split("#")[0].strip() for line in shell.strip().splitlines()]
    exports = [line.removeprefix("export ") for line in lines if line.startswith("export ")]
    assert lines[len(exports) :] == ["celery -A proj worker", "celery -A proj beat"]
    worker_line, beat_line = lines[len(exports) :]
    env = {k: v for k, v in services_env.items() if not k.startswith("THREADS_")}  # the page's own only
    # The page's services are placeholders (postgresql://app@db/app, redis://redis): this test's stand in.
    ours = {"THREADS_DATABASE_URL": migrated_pg_url, "THREADS_BROKER_URL": integration_redis_url}
    for assignment in " ".join(exports).split():
        name, _, value = assignment.partition("=")
        env[name] = ours.get(name, value)
    assert {"THREADS_DATABASE_URL", "THREADS_BROKER_URL", "THREADS_AGENTS"} <= set(env)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    env["REVIEWS_FILE"] = str(tmp_path / "reviews.jsonl")
    celery = str(Path(sys.executable).with_name("celery"))
    worker = ManagedProcess("docs-own-worker", [celery, *worker_line.split()[1:]], env=env, log_path=tmp_path / "w.log")
    beat = ManagedProcess(
        "docs-own-beat",
        [celery, *beat_line.split()[1:], "-s", str(tmp_path / "beat-schedule")],
        env=env,
        log_path=tmp_path / "beat.log",
    )
    worker.cwd = beat.cwd = tmp_path
    worker.start()
    beat.start()
    try:
        from celery import Celery

        client = Celery("docs-client", broker=integration_redis_url)
        try:
            client.send_task("proj.tasks.review_order", args=[7], queue="proj")

            def reviewed() -> list[Any]:
                assert worker.alive(), f"the worker exited:\n{worker.log_tail()}"
                path = tmp_path / "reviews.jsonl"
                return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

            found = eventually(reviewed, timeout=WAIT_S, what="the run's end called order_reviewed")
            assert found == [{"order": 7, "review": found[0]["review"]}]
            assert beat.alive(), f"beat exited:\n{beat.log_tail()}"
        finally:
            client.close()
    finally:
        beat.terminate()
        worker.terminate()
