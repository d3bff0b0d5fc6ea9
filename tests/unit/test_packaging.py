"""What the distribution installs, and the app installed users name by the package.

A top-level ``tasks`` or ``beat`` in site-packages would shadow a user's own ``tasks.py``: only
``threads_celery`` is installed, and ``celery -A threads_celery.worker worker|beat`` finds the same
app that ``celery -A tasks`` finds from the repository root (or in the image).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from setuptools import find_packages

from tests.support.processes import REPO_ROOT as REPO


def test_the_distribution_installs_threads_celery_alone_at_the_top_level() -> None:
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(where=str(REPO), include=find["include"], exclude=find.get("exclude", ()))
    assert {name.split(".")[0] for name in packages} == {"threads_celery"}
    assert {"threads_celery.worker", "threads_celery.transitions"} <= set(packages)
    # The repository-root shims exist (for `celery -A tasks`) but are not part of it.
    assert {"tasks", "beat"} <= set(find_packages(where=str(REPO)))


FIND_APP = textwrap.dedent(
    """
    import json, sys
    from celery.app.utils import find_app
    from celery.utils.imports import symbol_by_name

    app = find_app(sys.argv[1])  # what `celery -A <name>` does
    scheduler = symbol_by_name(app.conf.beat_scheduler)
    print(json.dumps({
        "class": type(app).__name__,
        "tasks": sorted(name for name in app.tasks if name.startswith("threads.")),
        "broker": app.conf.broker_url,
        "scheduler": f"{scheduler.__module__}.{scheduler.__qualname__}",
        "loaded_shims": sorted(m for m in ("tasks", "beat") if m in sys.modules),
    }))
    """
)


def find_app(name: str, *, cwd: Path, python_path: list[Path], ledger: Path) -> dict[str, object]:
    """``celery -A name``'s app, described by a fresh interpreter configured by THREADS_* variables
    (the ledger is never opened: building the app does not touch it)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_") and k != "PYTHONPATH"}
    environment |= {
        "THREADS_DATABASE_URL": f"sqlite:///{ledger}",
        "THREADS_BROKER_URL": "memory://",
        "PYTHONPATH": os.pathsep.join(map(str, python_path)),
    }
    result = subprocess.run(
        [sys.executable, "-c", FIND_APP, name],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


EXPECTED_TASKS = [
    "threads.deliver",
    "threads.reconcile",
    "threads.retention_sweep",
    "threads.scheduled_run",
    "threads.step",
    "threads.tool",
]


def test_celery_finds_the_app_by_the_package_name_outside_the_repository(tmp_path: Path) -> None:
    # As an installed user runs it: from their own directory, with no repository on the path.
    found = find_app("threads_celery.worker", cwd=tmp_path, python_path=[], ledger=tmp_path / "ledger.db")
    assert found == {
        "class": "ThreadsCelery",
        "tasks": EXPECTED_TASKS,
        "broker": "memory://",
        "scheduler": "threads_celery.worker.beat.Scheduler",
        "loaded_shims": [],
    }


def test_the_repository_shims_give_the_same_app(tmp_path: Path) -> None:
    for shim in ("tasks", "beat"):
        found = find_app(shim, cwd=REPO, python_path=[REPO], ledger=tmp_path / "ledger.db")
        assert found["class"] == "ThreadsCelery" and found["tasks"] == EXPECTED_TASKS, shim
        assert found["scheduler"] == "threads_celery.worker.beat.Scheduler"
