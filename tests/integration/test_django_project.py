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

from tests.integration.django_project.harness import PROJECT, manage, project_env, require_django, shop_script
from tests.support.clients import registered_client
from tests.support.processes import ManagedProcess, free_port

require_django()
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


# -- the API and the console in Django's ASGI application --------------------------------------

#: Makes a staff user and a user who is not, signs each in (Django's own login, so a real session
#: in the session engine) and prints their primary keys and session cookies.
SIGNED_IN_USERS = """
import json
from django.contrib.auth.models import User
from django.test import Client
out = {}
for name, staff in (("ann", True), ("bob", False)):
    user, _ = User.objects.get_or_create(username=name, defaults={"is_staff": staff})
    user.set_password("pw-" + name)
    user.save()
    client = Client()
    assert client.login(username=name, password="pw-" + name)
    out[name] = {"pk": user.pk, "session": client.cookies["sessionid"].value}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def served(migrated: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The project's ASGI application (``proj/asgi.py``) on uvicorn, at its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "proj.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    process = ManagedProcess(
        "shop-asgi", argv, env=migrated, log_path=tmp_path_factory.mktemp("asgi") / "a.log", cwd=PROJECT
    )
    with process:
        process.start()
        process.wait_for_log(r"Uvicorn running on", timeout=WAIT_S, what="uvicorn up")
        yield f"http://127.0.0.1:{port}"


def test_the_api_and_console_answer_djangos_users_each_within_its_tenant(
    served: str,
    project_worker: ManagedProcess,
    migrated: dict[str, str],
    pg_url_module: str,
    integration_redis_url: str,
) -> None:
    import httpx

    done = shop_script(migrated, SIGNED_IN_USERS)
    assert done.returncode == 0, done.stderr
    users = json.loads(done.stdout.strip().splitlines()[-1])
    with registered_client(pg_url_module, integration_redis_url, []) as threads:
        runs = {
            name: threads.start("order_helper", f"for {name}", tenant=str(u["pk"])).run_id for name, u in users.items()
        }

    def get(path: str, who: str | None = None) -> httpx.Response:
        cookies = {"sessionid": users[who]["session"]} if who else {}
        return httpx.get(served + path, cookies=cookies, timeout=30, follow_redirects=False)

    # Nobody signed in: no API, no console.
    assert get("/agents/api/v1/runs").status_code == 401
    assert get("/agents/console/").status_code == 401
    assert get("/agents/api/v1/runs", "bob").status_code == 200
    # A user sees its own tenant's runs only; a user who is not staff has no console.
    listed = {r["id"] for r in get("/agents/api/v1/runs?limit=100", "bob").json()}
    assert runs["bob"] in listed and runs["ann"] not in listed
    assert get("/agents/console/", "bob").status_code == 403
    staff = get("/agents/console/", "ann")
    assert staff.status_code == 200 and "text/html" in staff.headers["content-type"]
    # A session that is not one (signed out, forged) is nobody.
    forged = httpx.get(served + "/agents/api/v1/runs", cookies={"sessionid": "not-a-session"}, timeout=30)
    assert forged.status_code == 401
    # Everything else is still Django's.
    assert get("/orders").status_code == 405  # the shop's view takes POST only
