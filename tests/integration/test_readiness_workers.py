"""``/readyz`` lists the workers consuming the broker, and ``?worker=1`` waits for one.

A real ``threads-celery worker`` process is started after the API: until it consumes, the API is
not ready for ``?worker=1`` (503, naming the count) while plain ``/readyz`` stays ready; once the
worker answers, its node name is listed and ``?worker=1`` is ready; once it is stopped, its name
goes and ``?worker=1`` is not ready again.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.support.processes import REPO_ROOT, THREADS_CELERY, ManagedProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery import Threads
from threads_celery.api.app import create_api

READY_TIMEOUT_S = 90.0
AGENTS_MODULE = (
    "from threads_celery import Agent\n"
    "from threads_celery.testing import ScriptedModel, say\n"
    "ok = Agent(name='readiness-ok', instructions='x', model=ScriptedModel([say('hi')]))\n"
)


def _mine(body: dict[str, Any], node: str) -> list[str]:
    return [name for name in body["workers"] if name.startswith(f"{node}@")]


def test_readyz_waits_for_a_consuming_worker(tmp_path: Path, migrated_pg_url: str, redis_url: str) -> None:
    (tmp_path / "readiness_agents.py").write_text(AGENTS_MODULE)
    node = f"ready-{uuid.uuid4().hex[:6]}"
    env = subprocess_env(
        {
            "THREADS_DATABASE_URL": migrated_pg_url,
            "THREADS_BROKER_URL": redis_url,
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}",
        }
    )
    argv = [THREADS_CELERY, "worker", "--agents", "readiness_agents", "--pool", "solo", "-n", f"{node}@%h"]
    worker = ManagedProcess("readiness-worker", argv, env=env, log_path=tmp_path / "worker.log", cwd=tmp_path)
    with Threads(database_url=migrated_pg_url, broker_url=redis_url) as threads:
        app = create_api(threads, env={"THREADS_API_AUTH": "off"})
        with TestClient(app) as client:
            plain = client.get("/readyz")
            assert plain.status_code == 200 and _mine(plain.json(), node) == []
            before = client.get("/readyz", params={"worker": 1})
            if not before.json()["workers"]:  # no other suite's worker on this broker just now
                assert before.status_code == 503, before.text
                assert before.json()["checks"]["workers"] == "unavailable"
                assert "0 of the 1 workers asked for answered a ping" in before.json()["error"]["message"]
            worker.start()
            try:

                def ready_with_it() -> dict[str, Any] | None:
                    assert worker.alive(), worker.log_text()
                    response = client.get("/readyz", params={"worker": 1})
                    body: dict[str, Any] = response.json()
                    return body if response.status_code == 200 and _mine(body, node) else None

                body = eventually(
                    ready_with_it, timeout=READY_TIMEOUT_S, what="the worker listed by /readyz", detail=worker.log_tail
                )
                assert body["checks"] == {"database": "ok", "broker": "ok", "workers": "ok"}
                assert _mine(client.get("/readyz").json(), node)  # listed without ?worker too
            finally:
                worker.terminate(timeout=30)

            def gone() -> bool:
                return _mine(client.get("/readyz").json(), node) == []

            eventually(gone, timeout=30, what="the stopped worker no longer listed")
            assert client.get("/readyz", params={"worker": 10_000}).status_code == 503
            assert client.get("/readyz", params={"worker": -1}).status_code == 422
