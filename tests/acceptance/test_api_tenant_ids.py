"""Ids a caller chooses belong to its tenant, on SQLite and PostgreSQL.

Two tenants (and the ``default`` one of a bare token) use the same ``run_id`` and ``thread_id``
without seeing or blocking each other; another tenant's id, chosen or server-generated, answers
exactly as an id nobody ever used; and every answer (bodies, Location, listings, SSE payloads,
drill-in, parked calls, errors) shows the ids the caller chose, never their stored form. The
runtime is a real in-process Celery worker over a SQLite file or a fresh PostgreSQL database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from tests.support.waiting import eventually
from threads_celery import Agent, Settings, Threads, agent_tool, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

ALICE = {"Authorization": "Bearer tok-alice-acme-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-globex-0123456789"}
LEGACY = {"Authorization": "Bearer legacy-bare-token-0123456789"}
LONG = {"Authorization": "Bearer tok-long-tenant-0123456789"}
LONGEST_TENANT = "t" * 128  # the longest name a tenant can have
TOKENS = (
    "alice@acme=tok-alice-acme-0123456789, bob@globex=tok-bob-globex-0123456789, legacy-bare-token-0123456789,"
    f"carl@{LONGEST_TENANT}=tok-long-tenant-0123456789"
)
DEADLINE_S = 30.0


class Mail(BaseModel):
    to: str


send = tool(name="send", description="Send mail.", input=Mail, execute=lambda i, c: f"sent to {i.to}")  # asks first
greeter = Agent(name="ids-greeter", instructions="x", model=ScriptedModel([say("hello")], per="run"))
mailer = Agent(
    name="ids-mailer", instructions="x", tools=[send],
    model=ScriptedModel([call("send", to="ann@example.com"), say("sent")], per="run"),
)  # fmt: skip
researcher = Agent(name="ids-researcher", instructions="x", model=ScriptedModel([say("found it")], per="run"))
parent = Agent(
    name="ids-parent", instructions="x", tools=[agent_tool(researcher, "Research.")],
    model=ScriptedModel([call("ids_researcher", message="look"), say("done")], per="run"),
)  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def threads(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('ids') / 'ledger.db'}"
    else:
        url = request.getfixturevalue("pg_url_module")
    runtime = Threads(database_url=url, broker_url="memory://", settings=Settings(), migrate=True, worker_concurrency=2)
    for agent in (greeter, mailer, parent):
        runtime.register(agent)
    runtime.start_worker(reconcile_interval=0.5)
    try:
        yield runtime
    finally:
        runtime.stop_worker()
        runtime.close()


@pytest.fixture(scope="module")
def http(threads: Threads) -> Iterator[TestClient]:
    app = create_api(threads, env={"THREADS_API_TOKENS": TOKENS}, keepalive_s=0.2, poll_interval_s=0.02)
    with TestClient(app) as client:
        yield client


def start(http: TestClient, who: dict[str, str], agent: str = "ids-greeter", **ids: str) -> Any:
    return http.post("/v1/runs", headers=who, json={"agent": agent, "message": f"go {ids}", **ids})


def settled(http: TestClient, who: dict[str, str], run_id: str, *statuses: str) -> dict[str, Any]:
    """The run as ``who`` sees it, once it has one of ``statuses``."""
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.update(http.get(f"/v1/runs/{run_id}", headers=who).json())
        return seen.get("status") in statuses

    eventually(reached, timeout=DEADLINE_S, what=f"run {run_id} {statuses}", detail=lambda: seen)
    return seen


def frames(http: TestClient, path: str, who: dict[str, str], until: Callable[[dict[str, Any]], bool]) -> list[Any]:
    """The SSE frames' data at ``path`` up to the first that satisfies ``until``."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE_S
    with http.stream("GET", path, headers=who, params={"after": 0}) as stream:
        assert stream.status_code == 200, stream.read()
        for line in stream.iter_lines():
            assert time.monotonic() < deadline, f"the stream stalled after {found}"
            if line.startswith("data:"):
                found.append(json.loads(line.removeprefix("data:")))
                if until(found[-1]):
                    return found
    raise AssertionError("the stream ended")


#: The live frames other than deltas (docs/streaming.md): no ``thread_id``, no ``payload``.
LIVE_FRAMES = frozenset({"step_end", "step_void", "resync"})


def finished(data: dict[str, Any]) -> bool:
    return data["type"] == "run" and data["payload"].get("status") in ("completed", "error")


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def like_an_unused_id(http: TestClient, method: str, path: str, taken: str, who: dict[str, str], **kwargs: Any) -> Any:
    """The answer for another tenant's ``taken`` id, checked to be the one for an id nobody used."""
    answer = http.request(method, path, headers=who, **kwargs)
    unused = http.request(method, path.replace(taken, "never-used-id"), headers=who, **kwargs)
    assert answer.status_code == unused.status_code == 404, (answer.text, unused.text)
    assert answer.text == unused.text.replace("never-used-id", taken)
    return answer


def test_two_tenants_may_use_the_same_run_id(http: TestClient, threads: Threads) -> None:
    bob = start(http, BOB, run_id="order-1")
    alice = start(http, ALICE, run_id="order-1")
    assert bob.status_code == alice.status_code == 202, (bob.text, alice.text)
    assert alice.json()["run_id"] == bob.json()["run_id"] == "order-1"
    assert alice.headers["Location"] == bob.headers["Location"] == "/v1/runs/order-1"
    assert alice.json()["thread_id"] != bob.json()["thread_id"]
    for who, thread_id in ((ALICE, alice.json()["thread_id"]), (BOB, bob.json()["thread_id"])):
        run = settled(http, who, "order-1", "completed")
        assert (run["id"], run["thread_id"]) == ("order-1", thread_id)
        assert [r["id"] for r in http.get("/v1/runs", headers=who, params={"thread_id": thread_id}).json()] == [
            "order-1"
        ]


def test_two_tenants_may_use_the_same_thread_id(http: TestClient, threads: Threads) -> None:
    bob = start(http, BOB, thread_id="t1")
    first = start(http, ALICE, thread_id="t1")
    assert bob.status_code == first.status_code == 202, (bob.text, first.text)
    assert bob.json()["thread_id"] == first.json()["thread_id"] == "t1"
    settled(http, ALICE, first.json()["run_id"], "completed")
    settled(http, BOB, bob.json()["run_id"], "completed")
    again = start(http, ALICE, thread_id="t1")  # alice continues her own t1
    assert again.status_code == 202 and again.json()["thread_id"] == "t1", again.text
    settled(http, ALICE, again.json()["run_id"], "completed")
    mine = http.get("/v1/threads/t1/messages", headers=ALICE).json()
    theirs = http.get("/v1/threads/t1/messages", headers=BOB).json()
    assert [m["run_id"] for m in mine if m["role"] == "user"] == [first.json()["run_id"], again.json()["run_id"]]
    assert [m["run_id"] for m in theirs if m["role"] == "user"] == [bob.json()["run_id"]]
    assert {m["thread_id"] for m in mine + theirs} == {"t1"}
    listed = http.get("/v1/runs", headers=ALICE, params={"thread_id": "t1"}).json()
    assert {r["id"] for r in listed} == {first.json()["run_id"], again.json()["run_id"]}


@pytest.mark.parametrize("kind", ["chosen", "server-generated"])
def test_another_tenants_thread_id_starts_a_thread_of_the_callers_own(
    http: TestClient, threads: Threads, kind: str
) -> None:
    bob = start(http, BOB, **({"thread_id": f"bobs-{kind}"} if kind == "chosen" else {}))
    assert bob.status_code == 202, bob.text
    taken = bob.json()["thread_id"]
    settled(http, BOB, bob.json()["run_id"], "completed")
    bobs_messages = http.get(f"/v1/threads/{taken}/messages", headers=BOB).json()
    for who in (ALICE, LEGACY):
        unused = start(http, who, thread_id=f"unused-{kind}-{len(who['Authorization'])}")
        answer = start(http, who, thread_id=taken)
        assert answer.status_code == unused.status_code == 202, (answer.text, unused.text)
        assert answer.json().keys() == unused.json().keys()
        assert (answer.json()["thread_id"], answer.json()["status"]) == (taken, unused.json()["status"])
        run = settled(http, who, answer.json()["run_id"], "completed")
        assert run["thread_id"] == taken
        assert [m["run_id"] for m in http.get(f"/v1/threads/{taken}/messages", headers=who).json()] == [run["id"]] * 2
    assert http.get(f"/v1/threads/{taken}/messages", headers=BOB).json() == bobs_messages


def test_another_tenants_ids_answer_like_ids_never_used(http: TestClient, threads: Threads) -> None:
    chosen = start(http, BOB, agent="ids-parent", run_id="bobs-job", thread_id="bobs-chat")
    generated = start(http, BOB, agent="ids-mailer")
    assert chosen.status_code == generated.status_code == 202
    settled(http, BOB, "bobs-job", "completed")
    asking = generated.json()["run_id"]
    settled(http, BOB, asking, "awaiting_approval")
    [child] = http.get("/v1/threads/bobs-chat/agent-tool-runs", headers=BOB).json()
    [key] = [p["effect_key"] for p in http.get("/v1/parked", headers=BOB).json() if p["run_id"] == asking]
    for run_id, thread_id in (("bobs-job", "bobs-chat"), (asking, generated.json()["thread_id"])):
        like_an_unused_id(http, "GET", f"/v1/runs/{run_id}", run_id, ALICE)
        like_an_unused_id(http, "GET", f"/v1/runs/{run_id}/pending", run_id, ALICE)
        like_an_unused_id(http, "GET", f"/v1/threads/{thread_id}/messages", thread_id, ALICE)
        like_an_unused_id(http, "GET", f"/v1/threads/{thread_id}/events", thread_id, ALICE)
        like_an_unused_id(http, "GET", f"/v1/threads/{thread_id}/agent-tool-runs", thread_id, ALICE)
    like_an_unused_id(http, "POST", f"/v1/runs/{asking}/cancel", asking, ALICE)
    like_an_unused_id(http, "POST", f"/v1/calls/{key}/deny", key, ALICE, json={"reason": "no"})
    like_an_unused_id(
        http, "GET", f"/v1/threads/bobs-chat/agent-tool-runs/{child['run_id']}/events", "bobs-chat", ALICE
    )
    # Alice choosing bob's ids gets her own thread and run; bob's are untouched.
    mine = start(http, ALICE, run_id="bobs-job", thread_id="bobs-chat")
    assert mine.status_code == 202 and (mine.json()["run_id"], mine.json()["thread_id"]) == ("bobs-job", "bobs-chat")
    assert settled(http, ALICE, "bobs-job", "completed")["input"].startswith("go ")
    assert http.get("/v1/runs/bobs-job", headers=BOB).json()["agent"] == "ids-parent"
    assert http.get(f"/v1/runs/{asking}", headers=BOB).json()["status"] == "awaiting_approval"
    assert http.post(f"/v1/calls/{key}/deny", headers=BOB, json={"reason": "no"}).status_code == 200


def test_an_idempotent_re_post_returns_the_same_run(http: TestClient, threads: Threads) -> None:
    for who in (ALICE, LEGACY):
        first = start(http, who, run_id="order-2")
        again = start(http, who, run_id="order-2")
        assert first.status_code == again.status_code == 202
        assert again.json()["run_id"] == "order-2" and again.json()["thread_id"] == first.json()["thread_id"]
        settled(http, who, "order-2", "completed")
        assert [r["id"] for r in http.get("/v1/runs", headers=who).json()].count("order-2") == 1
    # The default tenant's ids are stored as they are: the Python client reads them unchanged.
    assert threads.get_run("order-2").thread_id == start(http, LEGACY, run_id="order-2").json()["thread_id"]
    assert threads.tenant_of(run_id="order-2") == "default"


def test_every_answer_shows_the_ids_the_caller_chose(http: TestClient, threads: Threads) -> None:
    started = start(http, ALICE, agent="ids-parent", run_id="job-7", thread_id="chat-7")
    assert started.status_code == 202
    every = frames(http, "/v1/threads/chat-7/events", ALICE, finished)
    # The live frames (the model's deltas and each step's end: no thread_id, no payload) show the
    # run id the caller chose too.
    assert {d["run_id"] for d in every} == {"job-7"} and any(d["type"] == "text_delta" for d in every)
    assert any(d["type"] == "step_end" for d in every)
    data = [d for d in every if not d["type"].endswith("_delta") and d["type"] not in LIVE_FRAMES]
    assert {d["thread_id"] for d in data} == {"chat-7"}
    assert data[-1]["payload"]["status"] == "completed"
    [child] = http.get("/v1/threads/chat-7/agent-tool-runs", headers=ALICE).json()
    assert child["run_id"].startswith("agent-tool:job-7:"), child
    for d in data:
        assert not [s for s in strings(d["payload"]) if "~" in s], d
    keys = {
        c["effect_key"] for m in http.get("/v1/threads/chat-7/messages", headers=ALICE).json() for c in m["tool_calls"]
    }
    assert keys and all(k.startswith("job-7:") for k in keys), keys
    assert [d for d in data if d["payload"].get("run_id") == child["run_id"]], "the agent-tool events name the child"
    drilled = frames(http, f"/v1/threads/chat-7/agent-tool-runs/{child['run_id']}/events", ALICE, finished)
    assert drilled[-1]["payload"]["status"] == "completed"
    # A parked call: listed, approved and read by the key the caller sees.
    start(http, ALICE, agent="ids-mailer", run_id="mail-1")
    settled(http, ALICE, "mail-1", "awaiting_approval")
    [parked] = [p for p in http.get("/v1/parked", headers=ALICE).json() if p["run_id"] == "mail-1"]
    assert parked["effect_key"].startswith("mail-1:") and "~" not in json.dumps(parked)
    assert http.get("/v1/runs/mail-1/pending", headers=ALICE).json()[0]["effect_key"] == parked["effect_key"]
    approved = http.post(f"/v1/calls/{parked['effect_key']}/approve", headers=ALICE, json={})
    assert approved.status_code == 200 and approved.json()["effect_key"] == parked["effect_key"]
    settled(http, ALICE, "mail-1", "completed")
    result = http.get(f"/v1/calls/{parked['effect_key']}/result", headers=ALICE).json()
    assert (result["effect_key"], result["result"]) == (parked["effect_key"], "sent to ann@example.com")
    # An error about the caller's own id names it as the caller knows it.
    clash = start(http, ALICE, agent="ids-mailer", thread_id="chat-7")
    assert clash.status_code == 409 and "chat-7" in clash.text and "~" not in clash.text, clash.text


def test_the_longest_ids_of_the_longest_tenant_are_stored(http: TestClient, threads: Threads) -> None:
    run_id, thread_id = "r" * 64, "c" * 64
    started = start(http, LONG, agent="ids-parent", run_id=run_id, thread_id=thread_id)
    assert started.status_code == 202, started.text
    assert settled(http, LONG, run_id, "completed")["thread_id"] == thread_id
    [child] = http.get(f"/v1/threads/{thread_id}/agent-tool-runs", headers=LONG).json()
    assert child["status"] == "completed" and child["run_id"].startswith(f"agent-tool:{run_id}:")
    assert threads.tenant_of(run_id=f"{LONGEST_TENANT}~{run_id}") == LONGEST_TENANT


@pytest.mark.parametrize(
    "bad", ["acme~order-1", "~", "a" * 65, "x" * 10_000, "ordér", "../etc", "a b", "", "-lead", "a\u0000b"]
)
def test_an_id_that_cannot_be_one_is_a_clear_422(http: TestClient, bad: str) -> None:
    for field in ("run_id", "thread_id"):
        answer = start(http, ALICE, **{field: bad})
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["type"] == "validation_error" and field in answer.json()["error"]["message"]
    if bad and "\u0000" not in bad and "/" not in bad:
        for path in (f"/v1/runs/{bad}", f"/v1/threads/{bad}/messages", f"/v1/runs?thread_id={bad}"):
            answer = http.get(path, headers=ALICE)
            assert answer.status_code == 422, (path, answer.text)
