"""``caller=``: the app's own FastAPI dependency names each request's Caller, for /v1 and the console.

One embedded runtime (SQLite, the in-process worker) serves the module. The app's "auth" is an
API key header mapped to users of two tenants, sync or async, with dependencies of its own.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from fastapi import Depends, Header, HTTPException, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel

import threads_celery.api
from tests.support.waiting import eventually
from threads_celery import Agent, Threads, Variable, tool
from threads_celery.api import Caller, create_api, create_console
from threads_celery.api import tenancy as tenancy_module
from threads_celery.testing import ScriptedModel, call, say

USERS = {"key-alice": Caller("alice", "acme"), "key-bob": Caller("bob", "globex")}
GREETER = Agent(name="caller_dep_greeter", instructions="Greet.", model=ScriptedModel([say("hello")]))


class NoInput(BaseModel):
    pass


read_note = tool(
    name="read_note",
    description="Read the note a person sets.",
    input=NoInput,
    execute=lambda inp, ctx: f"the note says {ctx.env('NOTE')}",
    effect="read_only",
    variables=[Variable("NOTE", required=True)],
)
#: Waits for a person to set NOTE: the console's inbox then holds a form for it.
WAITER = Agent(
    name="caller_dep_waiter",
    instructions="Read the note.",
    model=ScriptedModel([call("read_note"), say("read it")]),
    tools=[read_note],
)


def api_key_user(x_api_key: Annotated[str | None, Header()] = None) -> Caller:
    """A sync dependency reading a header: the app's own users, each in a tenant."""
    found = USERS.get(x_api_key or "")
    if found is None:
        raise HTTPException(401, "unknown API key", headers={"WWW-Authenticate": 'ApiKey realm="shop"'})
    return found


async def current_user(request: Request, user: Caller = Depends(api_key_user)) -> Caller:
    """An async dependency on another dependency and on the Request, as an app's often is."""
    request.state.seen_by_the_app = True
    if request.headers.get("x-banned") == "1":
        raise HTTPException(403, "this account is suspended")
    return user


@pytest.fixture(scope="module")
def threads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    with Threads.embedded(tmp_path_factory.mktemp("caller_dep") / "threads.db") as runtime:
        runtime.register(GREETER)
        runtime.register(WAITER)
        yield runtime


@pytest.fixture(scope="module")
def client(threads: Threads) -> Iterator[TestClient]:
    # THREADS_API_TOKENS is set and THREADS_API_AUTH is nonsense: with caller= neither is read.
    env = {"THREADS_API_TOKENS": "carol@acme=tok-carol", "THREADS_API_AUTH": "nonsense"}
    with TestClient(create_api(threads, caller=current_user, env=env), follow_redirects=False) as c:
        yield c


def as_user(key: str) -> dict[str, str]:
    return {"X-API-Key": key}


def started(client: TestClient, key: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/runs", json={"agent": GREETER.name, "message": "hi", **body}, headers=as_user(key))
    assert response.status_code == 202, response.text
    found: dict[str, Any] = response.json()
    return found


# -- /v1 ---------------------------------------------------------------------------------------


def test_the_dependency_names_the_caller_and_its_tenant_owns_the_run(client: TestClient, threads: Threads) -> None:
    run = started(client, "key-alice", run_id="order-1")
    assert run["run_id"] == "order-1"
    assert threads.tenant_of(run_id="acme~order-1") == "acme"  # alice's tenant, as the dependency said
    eventually(
        lambda: client.get("/v1/runs/order-1", headers=as_user("key-alice")).json()["status"] == "completed",
        timeout=30,
        what="alice's run completed",
    )
    # bob's tenant sees it as a run that does not exist, in the documented error shape
    other = client.get("/v1/runs/order-1", headers=as_user("key-bob"))
    assert other.status_code == 404
    assert other.json()["error"]["type"] == "run_not_found"
    assert [r["run_id"] for r in client.get("/v1/runs", headers=as_user("key-bob")).json()] == []


def test_refusals_of_the_dependency_keep_their_status_headers_and_the_error_shape(client: TestClient) -> None:
    missing = client.get("/v1/runs")
    assert missing.status_code == 401
    assert missing.json() == {"error": {"type": "unauthorized", "message": "unknown API key"}}
    assert missing.headers["www-authenticate"] == 'ApiKey realm="shop"'
    banned = client.get("/v1/runs", headers={**as_user("key-alice"), "X-Banned": "1"})
    assert banned.status_code == 403
    assert banned.json() == {"error": {"type": "forbidden", "message": "this account is suspended"}}


def test_the_static_tokens_are_not_used_with_a_dependency(client: TestClient) -> None:
    response = client.get("/v1/runs", headers={"Authorization": "Bearer tok-carol"})
    assert response.status_code == 401 and response.json()["error"]["message"] == "unknown API key"


def test_no_token_is_needed_when_the_app_authenticates(threads: Threads, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THREADS_API_TOKENS", raising=False)
    monkeypatch.delenv("THREADS_API_AUTH", raising=False)
    with TestClient(create_api(threads, caller=api_key_user)) as c:
        assert c.get("/v1/runs", headers=as_user("key-bob")).status_code == 200


def test_a_dependency_answering_none_or_something_else_is_a_logged_401_that_leaks_nothing(
    threads: Threads, caplog: pytest.LogCaptureFixture
) -> None:
    def optional_user(x_api_key: Annotated[str | None, Header()] = None) -> Any:
        return None if x_api_key is None else {"user": "alice", "password": "hunter2-secret"}

    with TestClient(create_api(threads, caller=optional_user, env={})) as c:
        anonymous = c.get("/v1/runs")
        assert anonymous.status_code == 401
        assert anonymous.json() == {"error": {"type": "unauthorized", "message": "not authenticated"}}
        with caplog.at_level(logging.ERROR, logger="threads_celery.api.auth"):
            wrong = c.get("/v1/runs", headers=as_user("anything"))
        assert wrong.status_code == 401 and "hunter2" not in wrong.text
        logged = [r.getMessage() for r in caplog.records if r.name == "threads_celery.api.auth"]
        assert len(logged) == 1 and "optional_user" in logged[0] and "dict" in logged[0]
        assert "hunter2" not in logged[0]


@pytest.mark.parametrize(
    ("caller", "problem"),
    [
        (Caller("alice", "acme~evil"), "its tenant is not"),
        (Caller("alice", "x" * 129), "its tenant is not"),
        (Caller("alice", ""), "its tenant is not"),
        (Caller("  ", "acme"), "its principal is empty"),
        (Caller("a" * 256, "acme"), "its principal is over 255 characters"),
    ],
)
def test_a_caller_the_ledger_cannot_hold_is_a_logged_401(
    threads: Threads, caplog: pytest.LogCaptureFixture, caller: Caller, problem: str
) -> None:
    def odd_user() -> Caller:
        return caller

    with TestClient(create_api(threads, caller=odd_user, env={})) as c, caplog.at_level(logging.ERROR):
        refused = c.post("/v1/runs", json={"agent": GREETER.name, "message": "hi"})
    assert refused.status_code == 401 and refused.json()["error"]["message"] == "not authenticated"
    [logged] = [r.getMessage() for r in caplog.records if r.name == "threads_celery.api.auth"]
    assert problem in logged and "odd_user" in logged


def test_an_email_principal_is_a_fine_caller(threads: Threads) -> None:
    def by_email() -> Caller:
        return Caller("alice@example.com", "acme")

    with TestClient(create_api(threads, caller=by_email, env={})) as c:
        assert c.get("/v1/runs").status_code == 200


def test_a_dependency_that_cannot_answer_a_caller_is_refused_when_the_app_is_built(threads: Threads) -> None:
    def a_user_row() -> dict[str, str]:
        return {"name": "alice"}

    with pytest.raises(TypeError, match=r"a_user_row returns dict, not a Caller"):
        create_api(threads, caller=a_user_row)
    with pytest.raises(TypeError, match="caller= takes a FastAPI dependency"):
        create_api(threads, caller="alice@acme")  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(TypeError, match="not both"):
        create_api(threads, caller=api_key_user, tokens=["alice@acme=t"])
    with pytest.raises(TypeError, match=r"a_user_row returns dict"):
        create_console(threads, caller=a_user_row)


def test_a_depends_marker_an_optional_caller_and_an_async_callable_object_are_taken(threads: Threads) -> None:
    class KeyToCaller:
        async def __call__(self, x_api_key: Annotated[str | None, Header()] = None) -> Caller | None:
            return USERS.get(x_api_key or "")

    for dependency in (Depends(api_key_user), KeyToCaller()):
        with TestClient(create_api(threads, caller=dependency, env={})) as c:
            assert c.get("/v1/runs", headers=as_user("key-alice")).status_code == 200
            assert c.get("/v1/runs", headers=as_user("nope")).status_code == 401


# -- the console -------------------------------------------------------------------------------


def test_the_console_asks_the_dependency_on_every_page_and_has_no_sign_in(client: TestClient) -> None:
    for path in ("/console/", "/console/inbox", "/console/agents", "/console/counts"):
        page = client.get(path, headers=as_user("key-alice"))
        assert page.status_code == 200, path
        assert "text/html" in page.headers["content-type"]
    home = client.get("/console/", headers=as_user("key-alice")).text
    assert 'id="principal">alice' in home and 'id="tenant">acme' in home
    assert "Sign out" not in home  # signing out is the app's business
    # The sign-in page asks the app too, and only sends a caller it knows to the runs.
    assert client.get("/console/sign-in", headers=as_user("key-alice")).headers["location"] == "/console/"
    assert client.get("/console/sign-in").status_code == 401
    token_sign_in = client.post("/console/sign-in", data={"token": "tok-carol"}, headers=as_user("key-bob"))
    assert token_sign_in.status_code == 303 and "set-cookie" not in token_sign_in.headers


def test_a_refusal_of_the_dependency_is_a_console_page_with_its_status(client: TestClient) -> None:
    refused = client.get("/console/")
    assert refused.status_code == 401 and "text/html" in refused.headers["content-type"]
    assert "unknown API key" in refused.text
    assert refused.headers["www-authenticate"] == 'ApiKey realm="shop"'  # a browser asks again for Basic
    assert refused.headers["content-security-policy"].startswith("default-src 'self'")
    banned = client.get("/console/inbox", headers={**as_user("key-alice"), "X-Banned": "1"})
    assert banned.status_code == 403 and "this account is suspended" in banned.text
    assert client.get("/console/runs/run_x/events").status_code == 401  # the live stream too


def test_console_forms_need_the_csrf_token_of_their_own_caller(client: TestClient, threads: Threads) -> None:
    run = threads.start(WAITER.name, "go", tenant="acme")
    eventually(lambda: threads.get_run(run.run_id).status == "awaiting_variable", timeout=30, what="waits for NOTE")
    page = client.get("/console/inbox", headers=as_user("key-alice")).text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None, "alice's inbox has the run's form"
    form = {"name": "NOTE", "value": "ship it", "back": "/inbox"}
    path = f"/console/threads/{run.thread_id}/env"
    assert client.post(path, data=form, headers=as_user("key-alice")).status_code == 403  # no CSRF token
    # bob cannot post alice's form: the token is an HMAC of who the caller is
    bobs = client.post(path, data={**form, "csrf": csrf.group(1)}, headers=as_user("key-bob"))
    assert bobs.status_code == 403
    assert threads.get_run(run.run_id).status == "awaiting_variable"
    alices = client.post(path, data={**form, "csrf": csrf.group(1)}, headers=as_user("key-alice"))
    assert alices.status_code == 303, alices.text
    eventually(lambda: threads.get_run(run.run_id).status == "completed", timeout=30, what="the run read its note")


def test_console_csrf_tokens_hold_across_processes_sharing_the_secret_key(threads: Threads) -> None:
    def csrf(console_app: Any, key: str) -> str:
        """The CSRF token the console puts in the forms it serves to the user of ``key``."""
        token: str = console_app.state.console.session_of_caller(USERS[key]).csrf
        return token

    shared = {"THREADS_SECRET_KEY": "k" * 44}
    one, two = (create_console(threads, caller=api_key_user, env=shared) for _ in range(2))
    assert csrf(one, "key-alice") == csrf(two, "key-alice") != csrf(one, "key-bob")
    alone = create_console(threads, caller=api_key_user, env={})
    assert csrf(alone, "key-alice") != csrf(one, "key-alice")  # without the key: this process's own


def test_another_tenants_run_is_a_missing_page_in_the_console(client: TestClient) -> None:
    started(client, "key-alice", run_id="order-console")
    assert client.get("/console/runs/order-console", headers=as_user("key-alice")).status_code == 200
    theirs = client.get("/console/runs/order-console", headers=as_user("key-bob"))
    assert theirs.status_code == 404 and "Not found" in theirs.text
    assert client.get("/console/no-such-page", headers=as_user("key-bob")).status_code == 404


def test_the_console_alone_behind_the_dependency(threads: Threads) -> None:
    with TestClient(create_console(threads, caller=current_user, env={})) as c:
        assert c.get("/", headers=as_user("key-bob")).status_code == 200
        assert c.get("/").status_code == 401


# -- the package's names -----------------------------------------------------------------------


def test_the_api_package_exports_caller_and_its_all_matches_its_lazy_names() -> None:
    assert threads_celery.api.Caller is tenancy_module.Caller
    assert sorted(threads_celery.api.__all__) == sorted(threads_celery.api._EXPORTS)
    for name in threads_celery.api.__all__:
        assert getattr(threads_celery.api, name) is not None, name
