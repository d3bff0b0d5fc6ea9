"""The console over a deployment: PostgreSQL, Redis and a real ``threads-celery worker`` process.

A person signed in to the console finds a child run's call in the inbox, approves it with edited
arguments, and reads the finished run's page: the worker ran the call with the edited arguments,
and the tree and timeline show the parent and its child as the ledger recorded them.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from tests.support.processes import REPO_ROOT, THREADS_CELERY, ManagedProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery import Threads
from threads_celery.api.app import create_api

WAIT_S = 60.0
TOKEN = "tok-console-integration-01"


def test_a_child_call_approved_in_the_console_runs_on_a_worker(
    tmp_path: Path, migrated_pg_url: str, redis_url: str
) -> None:
    secret_key = Fernet.generate_key().decode()
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": redis_url,
            "THREADS_SECRET_KEY": secret_key,
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    node = f"console-{uuid.uuid4().hex[:6]}"
    argv = [THREADS_CELERY, "worker", "--agents", "tests.support.console_agents", "--pool", "solo", "-n", f"{node}@%h"]
    worker = ManagedProcess("console-worker", argv, env=env, log_path=tmp_path / "worker.log", cwd=tmp_path)
    worker.start()
    previous = os.environ.get("THREADS_SECRET_KEY")
    os.environ["THREADS_SECRET_KEY"] = secret_key
    try:
        with Threads(database_url=migrated_pg_url, broker_url=redis_url) as threads:
            from tests.support import console_agents

            for agent in console_agents.AGENTS:
                threads.register(agent)  # edited arguments are validated against the tool's schema here
            app = create_api(threads, tokens=[f"alice@acme={TOKEN}"], env={})
            with TestClient(app, follow_redirects=False) as client:
                assert client.post("/console/sign-in", data={"token": TOKEN}).status_code == 303
                run_id = threads.start("console_parent", "go", tenant="acme").run_id
                [call] = eventually(
                    lambda: threads.pending(run_id),
                    timeout=WAIT_S,
                    what="the child's call waiting",
                    detail=lambda: worker.log_tail(),
                )
                inbox = client.get("/console/inbox").text
                assert f'data-effect-key="{call.effect_key}"' in inbox
                csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', inbox)
                assert csrf is not None
                response = client.post(
                    f"/console/calls/{call.effect_key}/approve",
                    data={
                        "csrf": csrf.group(1),
                        "args": json.dumps({"text": "edited on postgres"}),
                        "back": f"run:{run_id}",
                    },
                )
                assert response.status_code == 303
                eventually(
                    lambda: threads.get_run(run_id).status == "completed",
                    timeout=WAIT_S,
                    what="the parent run completed",
                    detail=lambda: worker.log_tail(),
                )
                page = client.get(f"/console/runs/{run_id}").text
                assert 'data-status="completed"' in page and f'data-child-run="{call.run_id}"' in page
                child = client.get(f"/console/runs/{call.run_id}").text
                assert "approved by alice" in child and "sent edited on postgres" in child
                assert client.get("/console/inbox").text.count("data-effect-key") == 0
    finally:
        worker.terminate()
        if previous is None:
            os.environ.pop("THREADS_SECRET_KEY", None)
        else:
            os.environ["THREADS_SECRET_KEY"] = previous
