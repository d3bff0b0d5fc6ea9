"""The console shows the deployment versions (state, workers, runs, stranded runs, pin reasons)
on its backbone page, and each run's version on the run's page; a ledger without versions shows
no section at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from tests.support.waiting import eventually
from threads_celery import Agent, Permissions, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions.runs import utcnow

TOKEN = "tok-oncall-0123456789"
TENANT_TOKEN = "tok-tenant-0123456789"


class Note(BaseModel):
    text: str


NOTIFY = tool(name="notify", description="Notify.", input=Note, effect="unguarded", execute=lambda i, c: "ok")
ASKER = Agent(
    name="console_deploy_asker",
    instructions="Ask first.",
    model=ScriptedModel([call("notify", text="x"), say("done")]),
    tools=[NOTIFY],
    permissions=Permissions(ask=["notify"]),
)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[Threads, TestClient]]:
    with Threads.embedded(tmp_path / "ledger.db") as threads:
        threads.register(ASKER)
        tokens = [f"oncall@default={TOKEN}", f"tenant@acme={TENANT_TOKEN}"]
        with TestClient(create_api(threads, tokens=tokens), follow_redirects=False) as app:
            signed = TestClient(app.app, follow_redirects=False)
            assert signed.post("/console/sign-in", data={"token": TOKEN}).status_code == 303
            yield threads, signed


def test_no_versions_no_section(client: tuple[Threads, TestClient]) -> None:
    _, console = client
    assert 'id="deploy-versions"' not in console.get("/console/agents").text


def test_the_versions_their_stranded_runs_and_a_runs_version_are_shown(client: tuple[Threads, TestClient]) -> None:
    threads, console = client
    with threads.store.transaction() as tx:
        tx.register_version("v1", {}, utcnow())
        tx.register_version("v2", {}, utcnow())
        tx.worker_seen("host:2", "v2", utcnow())
        tx.set_current_version("v2", utcnow())
    run_id = threads.start(ASKER, "go").run_id
    eventually(lambda: threads.get_run(run_id).status == "awaiting_approval", what="the run to wait")
    with threads.store.transaction() as tx:
        tx.place_run(run_id, "v1", "upgrade")
        tx.pin_run_version(run_id, checked="v2", reason="call x: tool 'notify' does not exist in v2")
    page = console.get("/console/agents").text
    assert 'data-version="v1"' in page and 'data-version="v2"' in page
    assert 'id="deploy-stranded"' in page and "<b>1</b> unfinished run(s)" in page
    assert "1: call x: tool &#39;notify&#39; does not exist in v2" in page
    assert "host:2" in page and "draining" in page
    tenant = TestClient(console.app, follow_redirects=False)
    assert tenant.post("/console/sign-in", data={"token": TENANT_TOKEN}).status_code == 303
    assert 'id="deploy-versions"' not in tenant.get("/console/agents").text  # the fleet's: operators only
    run_page = console.get(f"/console/runs/{run_id}").text
    assert 'id="run-version">v1</b> (upgrade)' in run_page
    assert "stays pinned, checked against v2" in run_page
