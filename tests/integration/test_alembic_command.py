"""The plain ``alembic`` command works from the repository root (alembic.ini there), reading the
ledger's URL from THREADS_DATABASE_URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from threads_celery.store.migrate import head_revision

REPO = Path(__file__).resolve().parents[2]


def alembic(*args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_")}
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_alembic_upgrades_and_reports_the_head_from_the_repository_root(pg_url: str) -> None:
    upgraded = alembic("upgrade", "head", THREADS_DATABASE_URL=pg_url)
    assert upgraded.returncode == 0, upgraded.stderr
    current = alembic("current", THREADS_DATABASE_URL=pg_url)
    assert current.returncode == 0, current.stderr
    assert f"{head_revision()} (head)" in current.stdout


def test_alembic_without_a_database_url_says_which_variable_to_set() -> None:
    result = alembic("current")
    assert result.returncode != 0
    assert "THREADS_DATABASE_URL is not set" in result.stderr
    assert "Traceback" not in result.stderr
