"""What an operator does to deployment versions, on the embedded ledger (SQLite): status, current,
ramp, rollback, retire; and the same status over HTTP (``GET /v1/deploy``) and on the command
line (``threads-celery deploy status``). The embedded worker itself runs no version: its runs
stay on none, as every run did before versions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from typer.testing import CliRunner

from tests.support.waiting import eventually
from threads_celery import Agent, Permissions, Threads, tool
from threads_celery.api import Caller, create_api
from threads_celery.cli.app import app as cli_app
from threads_celery.exceptions import DeployRefused
from threads_celery.testing import ScriptedModel, call, say
from threads_celery.transitions import deploy_control
from threads_celery.transitions.runs import utcnow


class Note(BaseModel):
    text: str


NOTIFY = tool(name="notify", description="Notify.", input=Note, effect="unguarded", execute=lambda i, c: "ok")
ASKER = Agent(
    name="deploy_asker",
    instructions="Ask first.",
    model=ScriptedModel([call("notify", text="x"), say("done")]),
    tools=[NOTIFY],
    permissions=Permissions(ask=["notify"]),
)


@pytest.fixture
def runtime(tmp_path: Path, embedded_threads: Callable[..., Threads]) -> Iterator[tuple[Threads, Path]]:
    db = tmp_path / "ledger.db"
    threads = embedded_threads(path=db)
    threads.register(ASKER)
    yield threads, db


def _register(threads: Threads, version: str, *, worker: str | None = None) -> None:
    with threads.store.transaction() as tx:
        tx.register_version(version, {"deploy_asker": "h"}, utcnow())
        if worker is not None:
            tx.worker_seen(worker, version, utcnow())


def _waiting_run(threads: Threads) -> str:
    run_id = threads.start(ASKER, "go").run_id
    eventually(lambda: threads.get_run(run_id).status == "awaiting_approval", what="the run to wait for approval")
    return run_id


def test_without_versions_a_run_is_on_none_and_the_status_is_empty(runtime: tuple[Threads, Path]) -> None:
    threads, _ = runtime
    run_id = _waiting_run(threads)
    assert threads.get_run(run_id).deploy_version is None
    assert deploy_control.status_document(threads.store) == {
        "current": None,
        "ramping": None,
        "stranded": 0,
        "versions": [],
    }


def test_the_first_version_is_current_and_later_ones_wait_to_be_made_current(runtime: tuple[Threads, Path]) -> None:
    threads, _ = runtime
    _register(threads, "v1", worker="host:1")
    _register(threads, "v2", worker="host:2")
    document = deploy_control.status_document(threads.store)
    assert document["current"] == "v1"
    states = {v["version"]: (v["state"], v["workers"]) for v in document["versions"]}
    assert states == {"v1": ("active", ["host:1"]), "v2": ("drained", ["host:2"])}

    deploy_control.set_current(threads.store, "v2")
    assert deploy_control.status_document(threads.store)["current"] == "v2"
    assert deploy_control.rollback(threads.store) == "v1"
    assert deploy_control.status_document(threads.store)["current"] == "v1"

    deploy_control.set_ramping(threads.store, "v2", 25)
    with threads.store.read() as tx:
        assert tx.placement() == ("v1", "v2", 25)
    assert deploy_control.status_document(threads.store)["ramping"] == {"version": "v2", "percent": 25}
    # A rollback during a ramp ends the ramp: new runs all go to the version that was current.
    deploy_control.rollback(threads.store)
    with threads.store.read() as tx:
        assert tx.placement()[1] is None


def test_bad_commands_are_refused_and_change_nothing(runtime: tuple[Threads, Path]) -> None:
    threads, _ = runtime
    _register(threads, "v1")
    with pytest.raises(DeployRefused, match="no worker of version 'v9'"):
        deploy_control.set_current(threads.store, "v9")
    with pytest.raises(DeployRefused, match="letters, digits"):
        deploy_control.set_current(threads.store, "v@1")
    with pytest.raises(DeployRefused, match="0 to 100"):
        deploy_control.set_ramping(threads.store, "v1", 101)
    with pytest.raises(DeployRefused, match="current already"):
        deploy_control.set_ramping(threads.store, "v1", 10)
    with pytest.raises(DeployRefused, match="is current"):
        deploy_control.retire(threads.store, "v1")
    with pytest.raises(DeployRefused, match="nothing to roll back to"):
        deploy_control.rollback(threads.store)
    assert deploy_control.status_document(threads.store)["current"] == "v1"


def test_retiring_waits_for_the_last_pinned_run_and_a_version_without_workers_strands_its_runs(
    runtime: tuple[Threads, Path],
) -> None:
    threads, _ = runtime
    _register(threads, "v1")
    _register(threads, "v2", worker="host:2")
    deploy_control.set_current(threads.store, "v2")
    run_id = _waiting_run(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run_id, "v1", "pinned")
    document = deploy_control.status_document(threads.store)
    [v1] = [v for v in document["versions"] if v["version"] == "v1"]
    assert v1["state"] == "draining" and v1["runs"] == {"awaiting_approval": 1}
    assert v1["stranded"] == 1 and document["stranded"] == 1  # v1 has no live worker
    with pytest.raises(DeployRefused, match="1 unfinished run"):
        deploy_control.retire(threads.store, "v1")

    [pending] = threads.pending(run_id)
    threads.deny(pending.effect_key, "not now")
    eventually(lambda: threads.get_run(run_id).is_terminal, what="the run to end")
    deploy_control.retire(threads.store, "v1")
    assert [v["version"] for v in deploy_control.status_document(threads.store)["versions"]] == ["v2"]


def test_a_worker_not_seen_within_the_liveness_window_is_not_live(runtime: tuple[Threads, Path]) -> None:
    threads, _ = runtime
    _register(threads, "v1")
    with threads.store.transaction() as tx:
        tx.worker_seen("host:old", "v1", utcnow() - timedelta(minutes=5))
    [v1] = deploy_control.deploy_status(threads.store)
    assert v1.workers == ()
    with threads.store.transaction() as tx:
        tx.worker_seen("host:old", "v1", utcnow())
    [v1] = deploy_control.deploy_status(threads.store)
    assert v1.workers == ("host:old",)
    with threads.store.transaction() as tx:
        tx.forget_worker("host:old")
    assert deploy_control.deploy_status(threads.store)[0].workers == ()


def test_the_http_api_answers_the_status(runtime: tuple[Threads, Path]) -> None:
    threads, _ = runtime
    _register(threads, "v1", worker="host:1")

    def caller() -> Caller:
        return Caller("ops", "default")

    client = TestClient(create_api(threads, caller=caller, console=False))
    answer = client.get("/v1/deploy")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["current"] == "v1" and body["versions"][0]["workers"] == ["host:1"]
    assert body == deploy_control.status_document(threads.store)

    def tenant() -> Caller:
        return Caller("someone", "acme")

    other = TestClient(create_api(threads, caller=tenant, console=False)).get("/v1/deploy")
    assert other.status_code == 403 and other.json()["error"]["type"] == "forbidden"


def test_the_command_line_shows_the_status_and_fails_on_stranded_runs(runtime: tuple[Threads, Path]) -> None:
    threads, db = runtime
    _register(threads, "v1", worker="host:1")
    env = {"THREADS_DATABASE_URL": f"sqlite:///{db}", "THREADS_BROKER_URL": ""}
    shown = CliRunner().invoke(cli_app, ["deploy", "status", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["current"] == "v1"
    table = CliRunner().invoke(cli_app, ["deploy", "status"], env=env)
    assert table.exit_code == 0 and "v1" in table.output and "active" in table.output

    run_id = _waiting_run(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run_id, "v0", "pinned")  # a version no worker runs
    stranded = CliRunner().invoke(cli_app, ["deploy", "status"], env=env)
    assert stranded.exit_code == 1, stranded.output
    assert "v0: 1 unfinished run(s) and no live worker" in " ".join(stranded.output.split())
    refused = CliRunner().invoke(cli_app, ["deploy", "retire", "v1"], env=env)
    assert refused.exit_code == 2 and "is current" in refused.output


def test_runs_show_names_the_version_of_the_run_and_of_each_step_and_call(runtime: tuple[Threads, Path]) -> None:
    threads, db = runtime
    run_id = _waiting_run(threads)
    with threads.store.transaction() as tx:
        tx.place_run(run_id, "v1", "upgrade")
        tx.mark_version(f"step:{run_id}:0", run_id, "v1", utcnow())
        tx.mark_version(f"{run_id}:0:0", run_id, "v1", utcnow())
        tx.pin_run_version(run_id, checked="v2", reason="call x: tool 'notify' does not exist in v2")
    env = {"THREADS_DATABASE_URL": f"sqlite:///{db}", "THREADS_BROKER_URL": ""}
    shown = CliRunner().invoke(cli_app, ["runs", "show", run_id], env=env)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "version v1 (upgrade)" in text and "taken by step 0 v1, call 0:0 v1" in text
    assert "checked against v2: call x: tool 'notify' does not exist in v2" in text
    as_json = CliRunner().invoke(cli_app, ["runs", "show", run_id, "--json"], env=env)
    document = json.loads(as_json.output)
    assert document["deploy_version"] == "v1"
    assert document["version_marks"] == {f"step:{run_id}:0": "v1", f"{run_id}:0:0": "v1"}


def test_an_upgrade_over_http_is_refused_without_a_live_worker_of_the_target(runtime: tuple[Threads, Path]) -> None:
    threads, _ = runtime
    _register(threads, "v1", worker="host:1")
    _register(threads, "v2")  # registered, but no worker of it is alive

    def operator() -> Caller:
        return Caller("ops", "default")

    def tenant() -> Caller:
        return Caller("someone", "acme")

    client = TestClient(create_api(threads, caller=operator, console=False))
    for body, status, words in (
        ({"from": "v1", "to": "v2"}, 409, "no live worker"),
        ({"from": "v1", "to": "v9"}, 409, "no worker of version 'v9'"),
        ({"from": "v1", "to": "v1"}, 409, "the same"),
        ({"from": "v1", "to": "v@2"}, 409, "letters, digits"),
        ({"from": "v1"}, 422, ""),
    ):
        answer = client.post("/v1/deploy/upgrade", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.text
    other = TestClient(create_api(threads, caller=tenant, console=False))
    assert other.post("/v1/deploy/upgrade", json={"from": "v1", "to": "v2"}).status_code == 403
