"""A rolling deploy, lean: real v1 and v2 worker processes on Redis and PostgreSQL, and Beat.

Runs start on v1 and wait for approval there: a pinned one (``mailer``) and upgrading ones whose
pending call v2 accepts (``mover``), renames an argument of (``renamed``), removes the tool of
(``faxer``), or whose current step has a result v2's output schema refuses (``counter``); detached
children of a finished parent wait in the background; an upgrading run is parked (its unguarded
call's pool process killed mid-call) and moves, to go on on v2 once a person settles the call;
two more runs are mid-stream. Then a
v2 worker starts (a tool removed, an argument renamed, the prompts changed, an output schema
changed) and becomes current, and v1 drains and stops. At each point ``deploy status`` matches
the ledger; nothing is lost, no unguarded effect runs twice, no pinned run runs anything on v2,
and every upgrading run either moved (and finished on v2) or stays pinned with its reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.clients import registered_client
from tests.support.processes import THREADS_CELERY, BeatProcess, WorkerProcess, subprocess_env
from tests.support.waiting import eventually
from threads_celery.api import Caller, create_api
from threads_celery.exceptions import DeployRefused
from threads_celery.transitions import deploy_control

pytestmark = pytest.mark.integration

AGENTS = "tests.integration.deploy_agents"
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("deploy") / "effects.jsonl"
    path.touch()
    return path


def _env(db: str, broker: str, ledger: Path, code: str) -> dict[str, str]:
    return subprocess_env({
        "THREADS_DATABASE_URL": db, "THREADS_BROKER_URL": broker, "THREADS_AGENTS": AGENTS,
        "THREADS_DEPLOY_VERSION": code, "DEPLOY_CODE": code, "DEPLOY_LEDGER": str(ledger),
        "THREADS_RECONCILE_INTERVAL_S": "1", "THREADS_DEPLOY_HEARTBEAT_S": "1", "THREADS_DEPLOY_LIVENESS_S": "5",
    })  # fmt: skip


def _worker(name: str, env: dict[str, str], tmp: pytest.TempPathFactory) -> WorkerProcess:
    return WorkerProcess(name, env=env, log_path=tmp.mktemp(name) / f"{name}.log", concurrency=1)


@pytest.fixture(scope="module")
def threads(migrated_pg_url: str, integration_redis_url: str, ledger: Path) -> Iterator[Any]:
    from tests.integration.deploy_agents import ALL_AGENTS

    with registered_client(migrated_pg_url, integration_redis_url, ALL_AGENTS) as client:
        yield client


def _status(threads: Any) -> dict[str, Any]:
    from threads_celery.transitions.deploy_control import status_document

    return status_document(threads.store, threads.settings.with_(deploy_liveness_s=5.0))


def _version(document: dict[str, Any], version: str) -> dict[str, Any]:
    return next(v for v in document["versions"] if v["version"] == version)


def _ledger_counts(threads: Any) -> dict[str, dict[str, int]]:
    """Unfinished runs by version and status, straight from the ledger (what status must match)."""
    with threads.store.read() as tx:
        rows = tx.unfinished_by_version()
    counts: dict[str, dict[str, int]] = {}
    for version, status, count in rows:
        counts.setdefault(version, {})[status] = count
    return counts


def _assert_status_matches_ledger(threads: Any) -> dict[str, Any]:
    document = _status(threads)
    counts = _ledger_counts(threads)
    for v in document["versions"]:
        assert v["runs"] == counts.get(v["version"], {}), (v, counts)
    return document


def _effects(ledger: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def _awaiting(threads: Any, run_id: str) -> Any:
    run = threads.get_run(run_id)
    return run if run.status == "awaiting_approval" else None


def _ended(threads: Any, run_id: str) -> Any:
    run = threads.get_run(run_id)
    return run if run.is_terminal else None


def _pending_key(threads: Any, run_id: str) -> str:
    [call] = threads.pending(run_id)
    return str(call.effect_key)


def _marks(threads: Any, run_id: str) -> dict[str, str]:
    with threads.store.read() as tx:
        return dict(tx.version_marks(run_id))


def _runs_upgrade(env: dict[str, str], *flags: str) -> list[dict[str, Any]]:
    """``threads-celery runs upgrade --from v1 --to v2`` where v2's code is, as a deployer runs it."""
    done = subprocess.run(
        [THREADS_CELERY, "runs", "upgrade", "--from", "v1", "--to", "v2", "--json", *flags],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


#: Runs of each kind (THREADS_DEPLOY_RUNS_PER_KIND): 1 in the main suite; 20 makes the full
#: size, over 200 runs in flight across the deploy (11 kinds, late ones included), on the same workers.
PER_KIND = int(os.environ.get("THREADS_DEPLOY_RUNS_PER_KIND", "1"))
#: What happens to each kind's runs: the version it finishes on, and the pin reason's telltale.
UPGRADING = {
    "mover": ("v2", None),
    "slow_mover": ("v2", None),
    "renamed": ("v1", "recorded arguments fail 'send_email' in v2"),
    "faxer": ("v1", "tool 'fax' does not exist in v2"),
    "counter": ("v1", "output schema in v2"),
    "parker": ("v2", None),
}
WAITING = ["mailer", "mover", "renamed", "faxer", "counter"]  # each waits for approval on v1


def _ids(kinds: dict[str, list[str]]) -> list[str]:
    return [run_id for ids in kinds.values() for run_id in ids]


def test_a_rolling_deploy_loses_nothing_and_keeps_pinned_runs_on_their_code(
    threads: Any, migrated_pg_url: str, integration_redis_url: str, ledger: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    deadline = DEADLINE_S * max(1, PER_KIND // 5)
    v1_env = _env(migrated_pg_url, integration_redis_url, ledger, "v1")
    v2_env = _env(migrated_pg_url, integration_redis_url, ledger, "v2")
    beat = BeatProcess(
        "deploy-beat", env=v1_env, log_path=tmp_path_factory.mktemp("beat") / "beat.log",
        schedule_path=tmp_path_factory.mktemp("beat-state") / "schedule",
    )  # fmt: skip
    v1a, v1b, v1c = (_worker(f"deploy-v1{n}", v1_env, tmp_path_factory) for n in "abc")
    v2 = _worker("deploy-v2", v2_env, tmp_path_factory)
    with beat.start(), v1a.start(), v1b.start():
        v1a.wait_ready()
        v1b.wait_ready()
        beat.wait_ready()
        # -- runs in flight on v1: waiting for approval, and two streaming as v2 starts ----
        started = {name: [threads.start(name, "go").run_id for _ in range(PER_KIND)] for name in WAITING}
        late = {name: [threads.start(name, "later").run_id for _ in range(PER_KIND)] for name in ("keeper", "mailer")}
        # Parked: an unguarded call whose pool process is killed mid-call waits for a person.
        started["parker"] = []
        for _ in range(PER_KIND):
            run_id = threads.start("parker", "go").run_id
            started["parker"].append(run_id)
            hung = eventually(
                lambda r=run_id: next((e for e in _effects(ledger) if e["tool"] == "hang" and e["key"].startswith(r)), None),
                timeout=deadline, what="the call to hang",
            )  # fmt: skip
            next(w for w in (v1a, v1b) if w.owns(int(hung["pid"]))).kill_child(int(hung["pid"]))
            eventually(
                lambda r=run_id: threads.get_run(r).status == "parked", timeout=deadline, what="the call to park"
            )
        # Detached children of a finished parent, each waiting for approval in the background.
        parent = threads.start("greeter", "parent").run_id
        parent_thread = eventually(lambda: _ended(threads, parent), timeout=deadline, what="the parent").thread_id
        handles = [
            threads.run_agent_tool(parent_thread, "keeper", {"message": "in the background"}, detached=True)
            for _ in range(PER_KIND)
        ]

        def child_of(handle: Any) -> str | None:
            row = threads.inspect_agent_tool_run(handle.run_id)
            return None if row is None else row.child_run_id

        started["detached"] = [
            eventually(lambda h=h: child_of(h), timeout=deadline, what="a detached child") for h in handles
        ]
        for run_id in [r for name, ids in started.items() if name != "parker" for r in ids] + _ids(late):
            run = eventually(lambda r=run_id: _awaiting(threads, r), timeout=deadline, what=f"{run_id} to wait")
            assert run.deploy_version == "v1"
        assert all(threads.get_run(r).deploy_version == "v1" for r in started["parker"])
        waiting = len(_ids(started)) + len(_ids(late)) - PER_KIND  # the parked ones are parked
        document = _assert_status_matches_ledger(threads)
        assert document["current"] == "v1"
        assert _version(document, "v1")["state"] == "active"
        assert _version(document, "v1")["runs"] == {"awaiting_approval": waiting, "parked": PER_KIND}
        assert len(_version(document, "v1")["workers"]) == 2
        streaming = [threads.start("streamer", "go").run_id for _ in range(PER_KIND)]
        slow = [threads.start("slow_mover", "go").run_id for _ in range(PER_KIND)]
        started["slow_mover"] = slow

        # -- v2 starts, and becomes current ---------------------------------------------
        with v2.start():
            v2.wait_ready()
            document = eventually(
                lambda: (d := _status(threads)) and any(v["version"] == "v2" and v["workers"] for v in d["versions"]) and d,
                timeout=deadline, what="v2's worker to be seen",
            )  # fmt: skip
            assert document["current"] == "v1", "a new version is not current until told"
            deploy_control.set_current(threads.store, "v2")
            with pytest.raises(DeployRefused, match="unfinished run"):
                deploy_control.retire(threads.store, "v1")

            # Upgrading runs are checked by v2's code: moved, or pinned with the exact reason.
            # (A run still queued when v2 became current is a new run: its first step places it on
            # v2 directly, as behind a backlog the slow movers' may be.)
            def checked() -> bool:
                runs = [threads.get_run(r) for name in UPGRADING for r in started[name]]
                return all(r.deploy_checked == "v2" or (r.deploy_version == "v2" and r.step <= 1) for r in runs)

            def unchecked() -> list[tuple[str, str, str | None, str | None]]:
                runs = [(name, threads.get_run(r)) for name in UPGRADING for r in started[name]]
                return [(n, r.status, r.deploy_version, r.deploy_checked) for n, r in runs if r.deploy_checked != "v2"]

            eventually(checked, timeout=deadline, what="the upgrading runs to be checked against v2", detail=unchecked)
            for name, (on, reason) in UPGRADING.items():
                for run_id in started[name]:
                    run = threads.get_run(run_id)
                    assert run.deploy_version == on, (name, run)
                    if reason is None:
                        assert run.deploy_pin_reason is None, (name, run)
                    else:
                        assert reason in (run.deploy_pin_reason or ""), (name, run)
            for run_id in started["renamed"]:
                assert "recipient" in (threads.get_run(run_id).deploy_pin_reason or "")
            for run_id in started["mailer"]:
                run = threads.get_run(run_id)
                assert run.deploy_version == "v1" and run.deploy_checked is None  # pinned: never checked
            document = _assert_status_matches_ledger(threads)
            assert document["current"] == "v2"
            assert _version(document, "v1")["state"] == "draining"

            # v1's workers stop one by one: with one left, v1 keeps its runs going.
            v1a.terminate()
            document = eventually(
                lambda: (d := _status(threads)) and len(_version(d, "v1")["workers"]) == 1 and d,
                timeout=deadline, what="v1 to lose a worker",
            )  # fmt: skip
            assert document["stranded"] == 0

            # A new run starts on v2, at once.
            fresh = threads.start("greeter", "hi").run_id
            done = eventually(lambda: _ended(threads, fresh), timeout=deadline, what="the new run to end")
            assert done.status == "completed" and done.output == "done on v2" and done.deploy_version == "v2"

            # Approvals: each run finishes on the code it is on.
            for name, ids in started.items():
                for run_id in ids:
                    eventually(lambda r=run_id: threads.pending(r), timeout=deadline, what=f"{run_id} to wait")
                    if name == "parker":  # a person says the hung call happened
                        threads.resolve(_pending_key(threads, run_id), "assume_done", principal="oncall")
                    else:
                        threads.approve(_pending_key(threads, run_id), principal="oncall")
            for name, ids in [*started.items(), ("streamer", streaming)]:
                on = UPGRADING.get(name, ("v1", None))[0]
                for run_id in ids:
                    run = eventually(lambda r=run_id: _ended(threads, r), timeout=deadline, what=f"{name} to end")
                    if name == "streamer":  # pinned where its first step placed it (v1, or v2 if it waited)
                        on = run.deploy_version
                    assert run.status == "completed" and run.output.startswith(f"done on {on}"), (name, run)
                    marks = _marks(threads, run_id)
                    if name == "streamer" or on == "v1":  # a pinned run ran nothing on another version
                        assert set(marks.values()) == {on}, (name, marks)
                    else:  # it moved at a step boundary: its last step ran on v2
                        assert marks[f"step:{run_id}:1"] == "v2", (name, marks)
            _assert_status_matches_ledger(threads)

            # -- v1's last worker stops: its last runs are stranded, flagged, moved explicitly --
            v1b.terminate()
            stranded = len(_ids(late))
            document = eventually(
                lambda: (d := _status(threads)) and _version(d, "v1")["stranded"] == stranded and d,
                timeout=deadline, what="v1's last runs to be flagged stranded",
            )  # fmt: skip
            assert _version(document, "v1")["workers"] == [] and document["stranded"] == stranded
            _assert_status_matches_ledger(threads)
            dry = {r["run_id"]: r["outcome"] for r in _runs_upgrade(v2_env, "--dry-run")}
            assert dry == {
                **{r: "compatible" for r in late["keeper"]},
                **{r: "pinned" for r in late["mailer"]},
            }
            assert all(threads.get_run(r).deploy_version == "v1" for r in late["keeper"]), "a dry run moves nothing"
            # Moved over HTTP by v2's own workers, then checked again on the command line.
            api = TestClient(create_api(threads, caller=lambda: Caller("oncall", "default"), console=False))
            sent = api.post("/v1/deploy/upgrade", json={"from": "v1", "to": "v2"})
            assert sent.status_code == 202, sent.text
            assert sorted(sent.json()["runs"]) == sorted(_ids(late))
            eventually(
                lambda: all(threads.get_run(r).deploy_version == "v2" for r in late["keeper"])
                and all(threads.get_run(r).deploy_checked == "v2" for r in late["mailer"]),
                timeout=deadline, what="v2's workers to move or pin v1's last runs",
            )  # fmt: skip
            for run_id in late["mailer"]:
                assert "recipient" in (threads.get_run(run_id).deploy_pin_reason or "")
            report = {r["run_id"]: r for r in _runs_upgrade(v2_env)}
            assert set(report) == set(late["mailer"]), "the moved runs are on v2 now"
            for run_id in late["mailer"]:
                assert report[run_id]["outcome"] == "pinned" and "recipient" in report[run_id]["reason"]
            for run_id in late["keeper"]:
                threads.approve(_pending_key(threads, run_id), principal="oncall")
            for run_id in late["keeper"]:
                run = eventually(lambda r=run_id: _ended(threads, r), timeout=deadline, what="a moved run to end")
                assert run.status == "completed" and run.output == "done on v2"
            document = _assert_status_matches_ledger(threads)
            assert _version(document, "v1")["stranded"] == PER_KIND
            with pytest.raises(DeployRefused, match=f"{PER_KIND} unfinished run"):
                deploy_control.retire(threads.store, "v1")

            # The runs that cannot move wait for v1's code: a v1 worker again finishes them.
            with v1c.start():
                v1c.wait_ready()
                for run_id in late["mailer"]:
                    threads.approve(_pending_key(threads, run_id), principal="oncall")
                for run_id in late["mailer"]:
                    run = eventually(lambda r=run_id: _ended(threads, r), timeout=deadline, what="a last v1 run")
                    assert run.status == "completed" and run.output == "done on v1"
            document = _assert_status_matches_ledger(threads)
            assert _version(document, "v1")["state"] == "drained" and document["stranded"] == 0
            deploy_control.retire(threads.store, "v1")
            assert all(v["version"] != "v1" for v in _status(threads)["versions"])

    # The detached children's finish reached their parent.
    for handle in handles:
        row = eventually(
            lambda h=handle: (r := threads.inspect_agent_tool_run(h.run_id)) and r.status == "completed" and r,
            timeout=deadline, what="a detached child's finish to be recorded",
        )  # fmt: skip
        assert row.child_run_id in started["detached"]

    # Nothing lost, nothing twice: every effect ran once, on the code its run was on.
    effects = _effects(ledger)
    keys = [e["key"] for e in effects]
    assert len(keys) == len(set(keys)), effects
    by_run = {e["key"].rsplit(":", 2)[0]: e["code"] for e in effects if e["tool"] != "count"}
    for name, ids in started.items():
        # The parked call ran on v1 before its run moved; a person settled it, and it never ran again.
        on = "v1" if name == "parker" else UPGRADING.get(name, ("v1", None))[0]
        assert all(by_run[r] == on for r in ids), (name, effects)
    assert all(by_run[r] == "v2" for r in late["keeper"]) and all(by_run[r] == "v1" for r in late["mailer"])
