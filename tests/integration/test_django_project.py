"""The shop project (``django_project/``) as its team runs it: ``manage.py migrate`` and
``manage.py threads migrate`` for the ledger, ``manage.py threads worker`` serving the project's
own Celery task and agent runs side by side on the project's Celery app (``proj/celery.py``), and
the project's agent tests (``shop/tests.py``) passing under Django's test runner and under
pytest-django, with the pytest plugin's fixtures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.django_project.harness import PROJECT, manage, project_env, shop_script
from tests.support.clients import registered_client
from tests.support.processes import ManagedProcess

pytest.importorskip("django", reason="the django extra is not installed")
pytestmark = pytest.mark.integration

WAIT_S = 60.0


@pytest.fixture(scope="module")
def env(pg_url_module: str, integration_redis_url: str) -> dict[str, str]:
    return project_env(pg_url_module, integration_redis_url)


@pytest.fixture(scope="module")
def migrated(env: dict[str, str]) -> dict[str, str]:
    done = manage(env, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    assert re.search(r"threads-celery ledger: migrated empty -> \w+ on postgresql", done.stdout), done.stdout
    again = manage(env, "threads", "migrate")
    assert again.returncode == 0, again.stderr
    assert "(already)" in again.stdout, again.stdout
    return env


@pytest.fixture(scope="module")
def project_worker(migrated: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """``manage.py threads worker``: a real worker of the project's Celery app."""
    argv = [sys.executable, "manage.py", "threads", "worker", "-n", "shop@%h", "--pool", "prefork",
            "--concurrency", "2", "-l", "INFO", "--without-mingle", "--without-gossip"]  # fmt: skip
    process = ManagedProcess(
        "shop-worker", argv, env=migrated, log_path=tmp_path_factory.mktemp("w") / "w.log", cwd=PROJECT
    )
    with process:
        process.start()
        process.wait_for_log(r"shop@\S+ ready\.", timeout=WAIT_S, what="worker ready")
        yield process


def test_the_ledger_is_migrated_by_manage_py_migrate_and_threads_migrate_finds_it_done(
    migrated: dict[str, str],
) -> None:
    done = manage(migrated, "threads", "migrate", "--bogus")
    assert done.returncode != 0 and "threads migrate takes no options: --bogus" in done.stderr


def test_the_projects_worker_serves_its_own_task_and_agent_runs_side_by_side(
    project_worker: ManagedProcess, migrated: dict[str, str], pg_url_module: str, integration_redis_url: str
) -> None:
    log = project_worker.log_text()
    assert "app:         proj:" in log  # the project's Celery app, not the runtime's own
    for queue in ("shop", "threads", "threads.control"):
        assert f".> {queue} " in log
    script = """
import json
from proj.celery import app
from django.test import Client
pong = app.send_task("shop.ping").id
placed = Client().post("/orders", {"item": "a lamp"}).json()
print(json.dumps({"placed": placed}))
"""
    done = shop_script(migrated, script)
    assert done.returncode == 0, done.stderr
    placed = json.loads(done.stdout.strip().splitlines()[-1])["placed"]
    with registered_client(pg_url_module, integration_redis_url, []) as threads:
        run: Any = threads.wait(placed["run_id"], WAIT_S)
    assert run.status == "completed" and run.output == "Your order is confirmed.", project_worker.log_tail()
    project_worker.wait_for_log(r"Task shop\.ping\[[^\]]+\] succeeded in [\d.]+s: 'pong'", timeout=WAIT_S)


def test_the_projects_agent_tests_pass_under_djangos_test_runner(migrated: dict[str, str]) -> None:
    done = manage(migrated, "test", "shop", "--noinput", "-v", "2")
    assert done.returncode == 0, done.stderr
    assert "test_the_helper_confirms_the_order (shop.tests.OrderHelperTests" in done.stderr
    assert re.search(r"Ran 1 test in [\d.]+s\s+OK", done.stderr), done.stderr


def test_the_projects_agent_tests_pass_under_pytest_django_with_the_plugins_fixtures(
    migrated: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "shop/tests.py"],
        cwd=PROJECT,
        env=migrated,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "django: version:" in done.stdout and "settings: proj.settings" in done.stdout  # pytest-django
    assert "OrderHelperTests::test_the_helper_confirms_the_order PASSED" in done.stdout
    assert "test_the_helper_confirms_the_order_with_the_plugins_fixture PASSED" in done.stdout
    assert re.search(r"\b2 passed\b", done.stdout)
