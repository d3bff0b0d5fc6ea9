"""docs/django.md as written: every file block is a part of the shop project's file it names
(``django_project/``, which the Django tests run), and every command of the page runs, in the
page's order, in a copy of that project on PostgreSQL and Redis: the migrations, the worker and
Beat up to their start, uvicorn serving the ASGI application (on a free port in place of 8000,
the one change made), and both test runners. The install line alone is not run (the suite runs
in the environment the test extra installed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.django_project.harness import PROJECT, project_env, require_django
from tests.support.processes import REPO_ROOT, ManagedProcess, free_port

require_django()
pytestmark = pytest.mark.integration

PAGE = REPO_ROOT / "docs" / "django.md"
WAIT_S = 90.0
_FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)

#: Lines of the page's shell blocks that start a service, and what its log says once it is up.
SERVICES = {
    "python manage.py threads worker -l INFO": r"\S+@\S+ ready\.",
    "python manage.py threads beat -l INFO": r"beat: Starting",
    "uvicorn proj.asgi:application --host 127.0.0.1 --port 8000": r"Uvicorn running on",
}
#: Lines that run to their end, and what their output must say.
COMMANDS = {
    "python manage.py migrate": r"threads-celery ledger: migrated",
    "python manage.py threads migrate": r"threads-celery ledger: at \w+ on .* \(already\)",
    "python manage.py test shop": r"Ran 1 test in [\d.]+s\s+OK",
    "pytest shop/tests.py": r"\b2 passed\b",
}
NOT_RUN = {
    "pip install 'threads-celery[django]'": "installs from the registry: the suite runs where the test extra installed it",
}


def blocks() -> list[tuple[str, str]]:
    return [(m["lang"], m["body"]) for m in _FENCE.finditer(PAGE.read_text(encoding="utf-8"))]


def shell_lines() -> list[str]:
    lines = []
    for lang, body in blocks():
        if lang == "bash":
            lines += [line.split("  #")[0].strip() for line in body.splitlines() if line.strip()]
    return lines


def test_every_file_block_is_a_part_of_the_projects_file_it_names() -> None:
    files = [(body.splitlines()[0], body) for lang, body in blocks() if lang in ("python", "ini")]
    assert len(files) >= 8
    for header, body in files:
        assert header.startswith("# "), f"a code block opens with {header!r}, not the file it is part of"
        path = PROJECT / header[2:].strip()
        excerpt = body.split("\n", 1)[1]
        assert excerpt in path.read_text(encoding="utf-8"), f"{PAGE.name}: the block of {path.name} is not in it"


def test_every_command_of_the_page_is_known_here() -> None:
    known = {*SERVICES, *COMMANDS, *NOT_RUN}
    assert [line for line in shell_lines() if line not in known] == []
    assert set(shell_lines()) == known  # and nothing here is left over from an older page


def test_the_pages_commands_run_as_written(pg_url_module: str, integration_redis_url: str, tmp_path: Path) -> None:
    project = tmp_path / "shop"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "harness.py"))
    env = project_env(pg_url_module, integration_redis_url)
    env["PYTHONPATH"] = f"{REPO_ROOT}:{project}"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for line in shell_lines():
        if line in NOT_RUN:
            continue
        if line in SERVICES:
            command = line.replace("--port 8000", f"--port {free_port()}")
            service = ManagedProcess(line.split()[-3], ["bash", "-c", f"exec {command}"], env=env,
                                     log_path=tmp_path / f"{len(os.listdir(tmp_path))}.log", cwd=project)  # fmt: skip
            with service:
                service.start()
                service.wait_for_log(SERVICES[line], timeout=WAIT_S, what=line)
            continue
        done = subprocess.run(
            ["bash", "-c", line], cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{line}:\n{output}"
        assert re.search(COMMANDS[line], output), f"{line}:\n{output}"
