"""Beat keeps its schedule state in ``.threads-celery/`` of its working directory by default.

``celery -A tasks beat`` would otherwise leave ``celerybeat-schedule*`` files in whatever
directory it runs in (a checkout, untracked), and ``threads-celery beat`` kept them under the
temporary directory, where the memory of published slots goes when ``/tmp`` is cleaned. Both
commands now write ``.threads-celery/celerybeat-schedule*`` (the folder is made if missing), and
a second Beat started in the same place reads the same file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, BeatProcess, subprocess_env
from tests.support.waiting import eventually


@pytest.mark.parametrize("cli", [False, True], ids=["celery-beat", "threads-celery-beat"])
def test_beat_state_lands_in_the_working_directory(
    cli: bool, tmp_path: Path, migrated_pg_url: str, redis_url: str
) -> None:
    workdir = tmp_path / "deployment"
    workdir.mkdir()
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": redis_url,
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    beat = BeatProcess("beat", env=env, log_path=tmp_path / "beat.log", schedule_path=None, cli=cli, cwd=workdir)
    beat.start()
    try:
        beat.wait_ready()

        def written() -> list[Path]:
            # The file exists as soon as Beat opens it, and holds something once Beat wrote it.
            # A dbm file may be between its old and new copy as it is looked at: look again.
            files = sorted((workdir / ".threads-celery").glob("celerybeat-schedule*"))
            try:
                return files if files and all(path.stat().st_size > 0 for path in files) else []
            except FileNotFoundError:
                return []

        eventually(written, timeout=60, what="Beat's state written in .threads-celery/", detail=beat.log_tail)
        assert not list(workdir.glob("celerybeat-schedule*")), os.listdir(workdir)
    finally:
        beat.terminate()
