"""The operations console through HTTP (FastAPI's TestClient) on an embedded runtime.

One embedded runtime (SQLite, the in-process worker) and the scripted agents of
``tests.support.console_agents`` serve the module; two tenants sign in with their own tokens.
The browser test (tests/acceptance/test_console_browser.py) drives the same pages in Chromium.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from tests.support import console_agents
from tests.support.console_agents import PAYLOAD
from tests.support.waiting import eventually
from threads_celery import Threads
from threads_celery.api.app import create_api
from threads_celery.api.console import runs as console_runs
from threads_celery.api.console.session import COOKIE, issue
from threads_celery.records import TERMINAL_STATUSES
from threads_celery.transitions.runs import utcnow

ALICE = "tok-alice-0123456789"
BOB = "tok-bob-0123456789"
TOKENS = [f"alice@acme={ALICE}", f"bob@globex={BOB}"]
SECRET = "sk-live-console-secret-4242"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def threads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threads]:
    previous = os.environ.get("THREADS_SECRET_KEY")
    os.environ["THREADS_SECRET_KEY"] = Fernet.generate_key().decode()
    try:
        with Threads.embedded(tmp_path_factory.mktemp("console") / "threads.db") as runtime:
            for agent in console_agents.AGENTS:
                runtime.register(agent)
            yield runtime
    finally:
        if previous is None:
            os.environ.pop("THREADS_SECRET_KEY", None)
        else:
            os.environ["THREADS_SECRET_KEY"] = previous


@pytest.fixture(scope="module")
def app_client(threads: Threads) -> Iterator[TestClient]:
    with TestClient(create_api(threads, tokens=TOKENS), follow_redirects=False) as client:
        yield client


def signed_in(app_client: TestClient, token: str) -> TestClient:
    client = TestClient(app_client.app, follow_redirects=False)
    response = client.post("/console/sign-in", data={"token": token})
    assert response.status_code == 303 and response.headers["location"] == "/console/"
    return client


@pytest.fixture(scope="module")
def alice(app_client: TestClient) -> TestClient:
    return signed_in(app_client, ALICE)


@pytest.fixture(scope="module")
def bob(app_client: TestClient) -> TestClient:
    return signed_in(app_client, BOB)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def wait_status(threads: Threads, run_id: str, *statuses: str) -> None:
    eventually(lambda: threads.get_run(run_id).status in statuses, timeout=WAIT_S, what=f"run in {statuses}")


def start(threads: Threads, agent: str, message: str = "go", **env: str) -> str:
    return threads.start(agent, message, tenant="acme", env=env or None).run_id


# -- access ------------------------------------------------------------------------------------


def test_without_a_session_every_page_goes_to_sign_in(app_client: TestClient) -> None:
    for path in ("/console/", "/console/inbox", "/console/agents", "/console/runs/run_x", "/console/counts"):
        response = app_client.get(path)
        assert response.status_code == 303 and response.headers["location"] == "/console/sign-in", path


def test_a_wrong_expired_or_forged_session_goes_back_to_sign_in_never_a_trace(app_client: TestClient) -> None:
    wrong = app_client.post("/console/sign-in", data={"token": "not-a-token"})
    assert wrong.status_code == 401 and "that token is not valid here" in wrong.text
    assert "Traceback" not in wrong.text and COOKIE not in wrong.headers.get("set-cookie", "")
    for cookie in (issue(ALICE, now=0), issue("not-a-token"), "garbage", "1.2.3", "9" * 13 + ".x"):
        client = TestClient(app_client.app, follow_redirects=False, cookies={COOKIE: cookie})
        response = client.get("/console/")
        assert response.status_code == 303 and response.headers["location"] == "/console/sign-in", cookie


def test_the_session_cookie_holds_no_token_and_is_http_only_and_strict(app_client: TestClient) -> None:
    response = app_client.post("/console/sign-in", data={"token": ALICE})
    cookie = response.headers["set-cookie"]
    assert ALICE not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console/" in cookie


def test_a_form_without_its_csrf_token_changes_nothing(threads: Threads, alice: TestClient) -> None:
    run_id = start(threads, "console_parent")
    wait_status(threads, run_id, "waiting", "awaiting_approval")
    [call] = eventually(lambda: threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    for csrf in (None, "0" * 64):
        data = {"args": call.args} | ({"csrf": csrf} if csrf else {})
        response = alice.post(f"/console/calls/{call.effect_key}/approve", data=data)
        assert response.status_code == 403
    assert [p.status for p in threads.pending(run_id)] == ["awaiting_approval"]
    threads.deny(call.effect_key, "cleanup", principal="test")


def test_a_malformed_id_is_a_page_not_found_never_a_json_error(alice: TestClient, app_client: TestClient) -> None:
    for path in ("/console/runs/%3Cscript%3E", "/console/calls/a%20b/result", "/console/calls/k/result?page=-1"):
        response = alice.get(path)
        assert response.status_code == 404 and "Not found" in response.text and "<script>" not in response.text
    anonymous = TestClient(app_client.app, follow_redirects=False)
    assert anonymous.get("/console/runs/%3Cscript%3E").headers["location"] == "/console/sign-in"


def test_a_post_from_another_origin_is_refused_even_with_the_csrf_token(threads: Threads, alice: TestClient) -> None:
    csrf = csrf_of(alice.get("/console/inbox").text)
    foreign = {"Origin": "https://evil.example"}
    response = alice.post("/console/grants/revoke", data={"csrf": csrf, "thread_id": "t", "tool": "x"}, headers=foreign)
    assert response.status_code == 403
    signed = alice.post("/console/sign-in", data={"token": ALICE}, headers=foreign)
    assert signed.status_code == 403 and "set-cookie" not in signed.headers
    same = alice.post("/console/sign-in", data={"token": ALICE}, headers={"Origin": "http://testserver"})
    assert same.status_code == 303


def test_with_authentication_off_there_is_no_sign_in_and_forms_still_need_their_csrf_token(threads: Threads) -> None:
    app = create_api(threads, env={"THREADS_API_AUTH": "off"})
    run_id = threads.start("console_keyed", "go").run_id  # the default tenant's: a form in its inbox
    wait_status(threads, run_id, "awaiting_variable")
    with TestClient(app, follow_redirects=False) as client:
        assert client.get("/console/sign-in").headers["location"] == "/console/"
        page = client.get("/console/inbox")
        assert page.status_code == 200 and 'id="principal">unauthenticated' in page.text
        data = {"thread_id": "t", "tool": "x"}
        assert client.post("/console/grants/revoke", data=data).status_code == 403
        assert client.post("/console/grants/revoke", data={**data, "csrf": csrf_of(page.text)}).status_code == 404


def test_the_console_can_be_turned_off(threads: Threads) -> None:
    with TestClient(create_api(threads, tokens=TOKENS, env={"THREADS_CONSOLE": "0"})) as client:
        assert client.get("/console/sign-in").status_code == 404
        assert client.get("/healthz").status_code == 200


# -- runs --------------------------------------------------------------------------------------


def test_another_tenants_run_reads_as_one_that_does_not_exist(
    threads: Threads, alice: TestClient, bob: TestClient
) -> None:
    run_id = start(threads, "console_parent")
    assert alice.get(f"/console/runs/{run_id}").status_code == 200
    theirs = bob.get(f"/console/runs/{run_id}")
    missing = bob.get("/console/runs/run_nobody_has_this")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.text == missing.text
    assert run_id not in bob.get("/console/").text
    searched = bob.get(f"/console/?q={run_id}").text
    assert 'id="no-match"' in searched and f'data-run-id="{run_id}"' not in searched


def test_the_list_filters_searches_and_pages(
    threads: Threads, alice: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = start(threads, "console_keyed"), start(threads, "console_keyed")
    for run_id in (first, second):  # the worker takes them in either order
        wait_status(threads, run_id, "awaiting_variable")
    page = alice.get("/console/?agent=console_keyed&status=awaiting_variable").text
    assert first in page and second in page and "console_parent" not in page.split("<tbody>")[1]
    assert alice.get(f"/console/?q={first}").text.count(f'data-run-id="{first}"') == 1
    thread_id = threads.get_run(first).thread_id
    assert f'data-run-id="{first}"' in alice.get(f"/console/?q={thread_id}").text
    monkeypatch.setattr(console_runs, "PAGE_SIZE", 1)
    newest = alice.get("/console/?agent=console_keyed").text
    assert f'data-run-id="{second}"' in newest and f'data-run-id="{first}"' not in newest
    older = re.search(r'id="older" href="([^"]+)"', newest)
    assert older is not None
    following = alice.get("/console/" + older.group(1).replace("&amp;", "&")).text
    assert f'data-run-id="{first}"' in following and f'data-run-id="{second}"' not in following
    counts = alice.get("/console/counts").text
    assert re.search(r'data-count-status="awaiting_variable">awaiting_variable <b>(\d+)</b>', counts)


# -- a run's page ------------------------------------------------------------------------------


def test_the_run_page_shows_the_tree_timeline_usage_and_every_payload_as_text(
    threads: Threads, alice: TestClient
) -> None:
    run_id = start(threads, "console_parent", message=f"please {PAYLOAD}")
    [call] = eventually(lambda: threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    threads.approve(call.effect_key, principal="alice")
    wait_status(threads, run_id, *TERMINAL_STATUSES)
    page = alice.get(f"/console/runs/{run_id}").text
    assert "<script>window.__pwned" not in page and "<img src=x" not in page and "<b>bold</b>" not in page
    assert page.count("&lt;script&gt;window.__pwned") >= 3  # input, model text, arguments (results are in the child)
    assert 'data-status="completed"' in page and "console_child" in page
    child_run = threads.get_run(call.run_id)
    assert f'data-child-run="{child_run.id}"' in page
    assert "Model turn 0" in page and "Model turn 1" in page and "effect unguarded" not in page
    child_page = alice.get(f"/console/runs/{child_run.id}").text
    assert f'id="parent-run" href="/console/runs/{run_id}"' in child_page
    assert "effect unguarded" in child_page and "approved by alice" in child_page
    assert "&lt;script&gt;" in child_page and "<script>window" not in child_page
    assert "model requests" in page


def test_a_50_mb_result_is_a_preview_on_the_page_and_read_in_pages(threads: Threads, alice: TestClient) -> None:
    run_id = start(threads, "console_keyed", API_KEY="x" * 8)
    wait_status(threads, run_id, "completed")
    [key] = [c.effect_key for c in _timeline(threads, run_id)]
    whole = "".join(f"{i:09d}\n" for i in range(5_000_000))  # 50,000,000 characters
    with threads.store.transaction() as tx:
        tx.keep_full_result(key, whole)
    page = alice.get(f"/console/runs/{run_id}")
    assert page.status_code == 200 and len(page.content) < 200_000
    assert "50000000 characters" in page.text and f"/console/calls/{quote(key, safe='/')}/result" in page.text
    first = alice.get(f"/console/calls/{key}/result")
    assert first.status_code == 200 and len(first.content) < 400_000 and "page 1 of 191" in first.text
    last = alice.get(f"/console/calls/{key}/result?page=190")
    assert "004999999" in last.text and "page 191 of 191" in last.text


def _timeline(threads: Threads, run_id: str) -> list[Any]:
    with threads.store.read() as tx:
        return tx.call_timeline(run_id, preview_chars=10)


# -- the inbox ---------------------------------------------------------------------------------


def test_edited_arguments_are_validated_and_bound_to_the_approval(
    threads: Threads, alice: TestClient, bob: TestClient
) -> None:
    run_id = start(threads, "console_parent")
    [call] = eventually(lambda: threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    inbox = alice.get("/console/inbox").text
    assert f'data-effect-key="{call.effect_key}"' in inbox and "a child of run" in inbox
    assert call.effect_key not in bob.get("/console/inbox").text
    assert "&lt;script&gt;" in inbox and "<script>window" not in inbox
    csrf = csrf_of(inbox)
    bad = alice.post(
        f"/console/calls/{call.effect_key}/approve",
        data={"csrf": csrf, "args": json.dumps({"text": 5}), "back": "inbox"},
    )
    assert bad.status_code == 303 and bad.headers["location"].startswith("/console/inbox?notice=")
    assert "text" in alice.get(bad.headers["location"]).text
    assert [p.status for p in threads.pending(run_id)] == ["awaiting_approval"]
    good = alice.post(
        f"/console/calls/{call.effect_key}/approve",
        data={
            "csrf": csrf,
            "args": json.dumps({"text": "edited in the console"}),
            "remember": "1",
            "back": f"run:{run_id}",
        },
    )
    assert good.status_code == 303 and good.headers["location"] == f"/console/runs/{run_id}"
    wait_status(threads, run_id, *TERMINAL_STATUSES)
    assert "edited in the console" in console_agents.SENT
    with threads.store.read() as tx:
        found = tx.get_call_and_run(call.effect_key)
    assert (
        found is not None
        and found[0].approved_by == "alice"
        and json.loads(found[0].args)["text"] == "edited in the console"
    )
    grants = alice.get("/console/inbox").text
    assert f'data-grant="{call.thread_id}/send_note"' in grants
    revoked = alice.post(
        "/console/grants/revoke", data={"csrf": csrf, "thread_id": call.thread_id, "tool": "send_note"}
    )
    assert revoked.status_code == 303 and threads.permission_grants(call.thread_id) == []
    assert any(
        e.type == "permission.revoked" and e.payload["principal"] == "alice" for e in threads.events(call.thread_id)
    )


def test_approving_in_the_inbox_goes_back_to_the_inbox(threads: Threads, alice: TestClient) -> None:
    run_id = start(threads, "console_parent")
    [call] = eventually(lambda: threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    inbox = alice.get("/console/inbox").text
    assert 'name="back" value="inbox"' in inbox
    approved = alice.post(f"/console/calls/{call.effect_key}/approve", data={"csrf": csrf_of(inbox), "back": "inbox"})
    assert approved.status_code == 303 and approved.headers["location"] == "/console/inbox"
    assert alice.get(approved.headers["location"]).status_code == 200
    wait_status(threads, run_id, "completed")


def test_a_missing_page_says_so_in_a_sentence(alice: TestClient) -> None:
    missing = alice.get("/console/runs/run_nobody_has_this")
    assert missing.status_code == 404
    assert "Not found: there is no run, thread or call with this id." in missing.text
    assert "Not found: there is no run, thread or call with this id." in alice.get("/console/calls/k0/result").text
    assert "Not found: there is no such page." in alice.get("/console/runs/%3Cx%3E").text


def test_a_refused_edit_goes_back_to_a_page_showing_why_with_the_draft_kept_on_the_server(
    threads: Threads, alice: TestClient, bob: TestClient
) -> None:
    run_id = start(threads, "console_parent")
    [call] = eventually(lambda: threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    draft = json.dumps({"text": 5, "note": "sk-draft-secret-9911"})
    refused = alice.post(
        f"/console/calls/{call.effect_key}/approve",
        data={"csrf": csrf_of(alice.get("/console/inbox").text), "args": draft, "remember": "1", "back": "inbox"},
    )
    # POST-redirect-GET: a reload repeats the GET; the URL holds a token, never what was typed.
    assert refused.status_code == 303
    location = refused.headers["location"]
    assert location.startswith("/console/inbox?notice=") and location.endswith(f"#call-{call.effect_key}")
    assert "sk-draft" not in location and "text" not in location
    for _ in range(2):  # the page, then its reload
        page = alice.get(location)
        assert page.status_code == 200 and 'id="action-error"' in page.text
        assert f"{call.effect_key}: " in page.text and "text" in page.text
        card = page.text.split(f'id="call-{call.effect_key}"', 1)[1].split("</article>", 1)[0]
        assert "card-error" in card and "sk-draft-secret-9911" in card  # the textarea holds the draft
        assert 'name="remember" value="1" checked' in card
    assert [p.status for p in threads.pending(run_id)] == ["awaiting_approval"]
    # Another session's browser at the same URL gets neither the reason nor the draft.
    theirs = bob.get(location)
    assert theirs.status_code == 200 and "sk-draft" not in theirs.text and "no longer known" in theirs.text
    assert "no longer known" in alice.get("/console/inbox?notice=made-up-token").text
    threads.deny(call.effect_key, "cleanup", principal="test")


def test_a_run_page_answers_its_waiting_calls_where_they_stand(threads: Threads, alice: TestClient) -> None:
    run_id = start(threads, "console_parent")
    [call] = eventually(lambda: threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    page = alice.get(f"/console/runs/{run_id}").text
    assert f'action="/console/calls/{quote(call.effect_key)}/approve"' in page
    assert f'action="/console/calls/{quote(call.effect_key)}/deny"' in page
    assert f'name="back" value="run:{run_id}"' in page
    csrf = csrf_of(page)
    refused = alice.post(
        f"/console/calls/{call.effect_key}/approve",
        data={"csrf": csrf, "args": json.dumps({"text": 5}), "back": f"run:{run_id}"},
    )
    assert refused.status_code == 303
    location = refused.headers["location"]
    assert location.startswith(f"/console/runs/{run_id}?notice=")
    shown = alice.get(location).text
    assert 'id="action-error"' in shown and "card-error" in shown
    assert f'data-live="/console/runs/{run_id}/live?notice=' in shown  # the live part keeps showing it
    approved = alice.post(
        f"/console/calls/{call.effect_key}/approve",
        data={"csrf": csrf, "args": json.dumps({"text": "approved on the run page"}), "back": f"run:{run_id}"},
    )
    assert approved.status_code == 303 and approved.headers["location"] == f"/console/runs/{run_id}"
    wait_status(threads, run_id, "completed")
    assert "approved on the run page" in console_agents.SENT

    parked = start(threads, "console_payments")
    wait_status(threads, parked, "parked")
    [charge] = threads.pending(parked)
    page = alice.get(f"/console/runs/{parked}").text
    assert f'action="/console/calls/{quote(charge.effect_key)}/resolve"' in page
    resolved = alice.post(
        f"/console/calls/{charge.effect_key}/resolve",
        data={"csrf": csrf, "resolution": "assume_done", "reason": "seen in the bank", "back": f"run:{parked}"},
    )
    assert resolved.status_code == 303 and resolved.headers["location"] == f"/console/runs/{parked}"
    wait_status(threads, parked, "completed")


def test_a_parked_call_is_resolved_with_a_reason(threads: Threads, alice: TestClient) -> None:
    run_id = start(threads, "console_payments")
    wait_status(threads, run_id, "parked")
    [call] = threads.pending(run_id)
    inbox = alice.get("/console/inbox").text
    assert f'data-effect-key="{call.effect_key}" data-status="parked"' in inbox
    assert "Waits because: " in alice.get(f"/console/runs/{run_id}").text
    csrf = csrf_of(inbox)
    no_reason = alice.post(
        f"/console/calls/{call.effect_key}/resolve", data={"csrf": csrf, "resolution": "assume_done"}
    )
    assert no_reason.status_code == 303 and threads.get_run(run_id).status == "parked"
    assert "a resolution needs a reason" in alice.get(no_reason.headers["location"]).text
    done = alice.post(
        f"/console/calls/{call.effect_key}/resolve",
        data={"csrf": csrf, "resolution": "assume_done", "reason": "the bank shows the charge"},
    )
    assert done.status_code == 303
    wait_status(threads, run_id, "completed")
    [entry] = _timeline(threads, run_id)
    assert entry.resolution == "assume_done" and entry.resolved_by == "alice"


def test_a_secret_variable_is_set_in_place_and_never_shown(threads: Threads, alice: TestClient) -> None:
    run_id = start(threads, "console_keyed")
    wait_status(threads, run_id, "awaiting_variable")
    inbox = alice.get("/console/inbox").text
    assert 'data-variable="API_KEY"' in inbox and 'type="password" name="value"' in inbox
    thread_id = threads.get_run(run_id).thread_id
    response = alice.post(
        f"/console/threads/{thread_id}/env",
        data={"csrf": csrf_of(inbox), "name": "API_KEY", "value": SECRET, "back": f"run:{run_id}"},
    )
    assert response.status_code == 303
    wait_status(threads, run_id, "completed")
    for path in (f"/console/runs/{run_id}", "/console/inbox", "/console/", "/console/agents"):
        assert SECRET not in alice.get(path).text, path
    [env] = [e for e in threads.events(thread_id) if e.type == "env"]
    assert env.payload == {"name": "API_KEY", "type": "secret", "principal": "alice"}


def test_agents_and_the_backbone(alice: TestClient) -> None:
    page = alice.get("/console/agents").text
    assert 'data-agent="console_payments"' in page and "charge_card <i>(idempotent)</i>" in page
    assert 'data-agent="console_child"' in page  # loaded with its parent, never recorded on its own
    assert "API_KEY (secret, required)" in page and "mode bypass" in page
    assert 'id="outbox-depth"' in page and "in-process" in page


def test_an_agent_name_holding_markup_is_shown_as_text(threads: Threads, alice: TestClient) -> None:
    # Agent() refuses such a name; a ledger written by something else may still hold one.
    with threads.store.transaction() as tx:
        tx.upsert_agent(PAYLOAD, "x", {"name": PAYLOAD, "tools": [{"name": PAYLOAD, "effect": PAYLOAD}]}, utcnow())
    for path in ("/console/agents", "/console/"):
        page = alice.get(path).text
        assert "<script>window.__pwned" not in page and "&lt;script&gt;window.__pwned" in page, path


def test_every_page_forbids_inline_script(alice: TestClient) -> None:
    for path in ("/console/", "/console/inbox", "/console/agents", "/console/sign-in"):
        policy = alice.get(path).headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy


def test_every_template_and_static_file_is_package_data() -> None:
    """The wheel carries the console's assets (no build step, no Node.js at install time)."""
    import fnmatch
    import tomllib

    from tests.support.processes import REPO_ROOT

    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = REPO_ROOT / "threads_celery"
    assets = [p for d in ("templates", "static") for p in (package / "api" / "console" / d).iterdir()]
    assert len(assets) >= 10
    for asset in assets:
        relative = asset.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns["threads_celery"]), relative
