"""The web app example (``python -m examples.webapp.app``) as a person uses it.

The app runs as a subprocess, embedded (SQLite and an in-process worker) with the research
coordinator and the trip planner, in a temporary directory. The HTTP tests speak to it with
httpx: the 303 after ``POST /runs``, the SSE stream and its ``Last-Event-ID`` resume, denying a
call. The browser test opens the page in headless Chromium (Debian's ``chromium`` and
``chromedriver``, through Selenium), starts a run, approves its call, and watches a child run's
progress bar move and the final answer appear. Without Chromium the browser test skips locally
and fails under ``CI=true`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import pytest

from tests.support.processes import ManagedProcess, free_port, subprocess_env
from tests.support.services import require_service
from tests.support.waiting import eventually

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
WAIT_S = 30.0
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1100,1400",
)

T = TypeVar("T")


@dataclass
class WebApp:
    url: str
    process: ManagedProcess
    workdir: Path

    def log_tail(self, lines: int = 60) -> str:
        return self.process.log_tail(lines)


@pytest.fixture(scope="module")
def webapp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebApp]:
    workdir = tmp_path_factory.mktemp("webapp")
    port = free_port()
    argv = [sys.executable, "-m", "examples.webapp.app", "--host", "127.0.0.1", "--port", str(port),
            "--db", str(workdir / "webapp.db"),
            "--agents", "examples.research,examples.demo,tests.support.child_approval_agent"]  # fmt: skip
    process = ManagedProcess("webapp", argv, env=subprocess_env(), log_path=workdir / "app.log", cwd=workdir)
    process.start()
    app = WebApp(f"http://127.0.0.1:{port}", process, workdir)

    def answers() -> bool:
        if not process.alive():
            raise AssertionError(f"the web app exited:\n{app.log_tail()}")
        try:
            return httpx.get(app.url + "/", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(answers, timeout=START_TIMEOUT_S, what="the web app answering")
        yield app
    finally:
        process.terminate()  # SIGTERM: uvicorn shuts down gracefully; SIGKILL after 15 s


@pytest.fixture
def http(webapp: WebApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=webapp.url, timeout=10) as client:
        yield client


def start(http: httpx.Client, agent: str, message: str) -> str:
    response = http.post("/runs", data={"agent": agent, "message": message})
    assert response.status_code == 303, response.text
    location = response.headers["location"]
    assert location.startswith("/runs/")
    return location.removeprefix("/runs/")


def pending(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    return http.get(f"/runs/{run_id}/pending").json()


def read_frames(
    webapp: WebApp, run_id: str, *, until: Callable[[dict[str, Any]], bool], last_event_id: int | None = None
) -> list[dict[str, Any]]:
    """SSE frames of the run's stream (each ``{id, event, data}``) up to the one ``until`` accepts."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    frames: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    deadline = time.monotonic() + WAIT_S
    timeout = httpx.Timeout(5.0, read=WAIT_S)
    with httpx.stream("GET", f"{webapp.url}/runs/{run_id}/events", headers=headers, timeout=timeout) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"the stream did not deliver the frame wanted within {WAIT_S:g}s: {frames[-5:]}")
            if line.startswith("id: "):
                frame["id"] = int(line[4:])
            elif line.startswith("event: "):
                frame["event"] = line[7:]
            elif line.startswith("data: "):
                frame["data"] = json.loads(line[6:])
            elif line == "" and "data" in frame:
                frames.append(frame)
                if until(frame):
                    return frames
                frame = {}
    raise AssertionError(f"the stream ended early: {frames[-5:]}")


def run_ended(frame: dict[str, Any]) -> bool:
    return frame["event"] == "run" and frame["data"]["payload"].get("status") in ("completed", "error", "aborted")


# -- HTTP -------------------------------------------------------------------------------------


def test_a_denied_call_is_reported_and_the_stream_resumes_after_last_event_id(
    webapp: WebApp, http: httpx.Client
) -> None:
    run_id = start(http, "trip-planner", "Plan dinner in Rome")
    page = http.get(f"/runs/{run_id}")
    assert page.status_code == 200 and run_id in page.text and "trip-planner" in page.text
    # The booking asks for approval; the form's Deny answers 303 back to the run's page.
    call = eventually(lambda: pending(http, run_id), what="the booking awaiting approval")[0]
    assert call["tool"] == "book_table" and call["status"] == "awaiting_approval"
    response = http.post(
        f"/calls/{quote(call['effect_key'], safe='')}/deny", data={"run_id": run_id, "reason": "not tonight"}
    )
    assert response.status_code == 303 and response.headers["location"] == f"/runs/{run_id}"

    frames = read_frames(webapp, run_id, until=run_ended)
    ids = [f["id"] for f in frames]
    assert ids == sorted(set(ids))  # in order, each once
    final = frames[-1]["data"]["payload"]
    assert final["status"] == "completed"
    assert "could not book" in final["output"] and "denied: not tonight" in final["output"]
    results = [
        f["data"]["payload"]["tool_result"]
        for f in frames
        if f["event"] == "message" and f["data"]["payload"]["role"] == "tool"
    ]
    booking = [r for r in results if r["name"] == "book_table"]
    assert len(booking) == 1 and "denied: not tonight" in booking[0]["content"]
    assert "send_email" not in [r["name"] for r in results]  # nothing booked, nothing to email
    assert all(f["data"]["run_id"] in (None, run_id) for f in frames)

    # A reconnecting browser sends Last-Event-ID and gets only what came after it.
    middle = ids[len(ids) // 2]
    resumed = read_frames(webapp, run_id, until=run_ended, last_event_id=middle)
    assert [f["id"] for f in resumed] == [i for i in ids if i > middle]


def test_a_child_runs_pending_approval_shows_on_the_parents_page_and_is_answered_there(
    webapp: WebApp, http: httpx.Client
) -> None:
    run_id = start(http, "child_approval_parent", "go")
    [entry] = eventually(
        lambda: [c for c in pending(http, run_id) if c["kind"] == "child"], what="the child's call at the parent"
    )
    assert (entry["tool"], entry["agent"], entry["status"]) == (
        "send_note",
        "child_approval_child",
        "awaiting_approval",
    )
    frames = read_frames(webapp, run_id, until=lambda f: f["event"] == "pending.child")
    assert frames[-1]["data"]["payload"]["effect_key"] == entry["effect_key"]

    key = quote(entry["effect_key"], safe="")
    response = http.post(f"/calls/{key}/approve", data={"run_id": run_id, "remember": "1"})
    assert response.status_code == 303 and response.headers["location"] == f"/runs/{run_id}"
    frames = read_frames(webapp, run_id, until=run_ended)
    assert frames[-1]["data"]["payload"]["status"] == "completed"
    assert "pending.answered" in [f["event"] for f in frames]
    assert pending(http, run_id) == []
    assert (webapp.workdir / "child-effects.txt").read_text().splitlines() == ["hello from the child"]


def test_the_app_module_imports_no_agent_code_and_no_model_layer() -> None:
    code = "import json, sys, examples.webapp.app; print(json.dumps(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout)
    leaked = [
        m
        for m in modules
        if m.startswith(
            (
                "pydantic_ai",
                "examples.demo",
                "examples.research",
                "threads_celery.runtime.models",
                "threads_celery.testing",
            )
        )
    ]
    assert leaked == []


def test_bad_requests_get_a_page_that_says_why(http: httpx.Client) -> None:
    unknown = http.post("/runs", data={"agent": "no-such-agent", "message": "hello"})
    assert unknown.status_code == 400 and "no-such-agent" in unknown.text and 'id="form-error"' in unknown.text
    empty = http.post("/runs", data={"agent": "trip-planner", "message": "  "})
    assert empty.status_code == 400
    assert http.get("/runs/run_does_not_exist").status_code == 404
    assert http.get("/runs/run_does_not_exist/events").status_code == 404
    stale = http.post("/calls/run_nope:0:0/approve", headers={"Accept": "application/json"})
    assert stale.status_code == 409 and stale.json()["ok"] is False


# -- the browser ------------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Any]:
    found = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()
    require_service(
        "Chromium", found, f"{CHROMIUM} and {CHROMEDRIVER} are needed (apt-get install chromium chromium-driver)"
    )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        require_service("Selenium", False, f"pip install selenium: {exc}")
        raise
    options = Options()
    options.binary_location = CHROMIUM
    for flag in BROWSER_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_run_page_shows_progress_moving_and_the_final_answer(webapp: WebApp, browser: Any) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    browser.get(webapp.url + "/")
    agent = browser.find_element(By.ID, "agent")
    agent.clear()
    agent.send_keys("research-coordinator")
    browser.find_element(By.ID, "message").send_keys("Compare HTTP/3 and gRPC")
    browser.find_element(By.ID, "start").click()
    eventually(lambda: "/runs/run_" in browser.current_url, what="the redirect to the run's page")

    # Approve what asks for approval, and sample every progress bar until the answer is shown.
    values: dict[str, list[float]] = {}
    approved = 0
    deadline = time.monotonic() + WAIT_S
    answer = ""
    while not answer:
        if time.monotonic() > deadline:
            shot = webapp.workdir / "timeout.png"
            browser.save_screenshot(str(shot))
            raise AssertionError(
                f"no final answer within {WAIT_S:g}s (screenshot {shot}); bars: {values}\n{webapp.log_tail()}"
            )
        for button in browser.find_elements(By.CSS_SELECTOR, "#approvals button.button-approve"):
            try:
                if button.is_displayed() and button.is_enabled():
                    button.click()
                    approved += 1
            except StaleElementReferenceException:
                pass  # the list was redrawn under us (a new status came in): look again
        bars = browser.execute_script(
            "return Array.from(document.querySelectorAll('.child')).map(c => {"
            " const bar = c.querySelector('progress');"
            " return [c.dataset.childRunId, bar.hasAttribute('value') ? bar.value : null]; })"
        )
        for child_id, value in bars:
            seen = values.setdefault(child_id, [])
            if value is not None and (not seen or seen[-1] != value):
                seen.append(value)
        answer = browser.find_element(By.ID, "final-answer").text
        time.sleep(0.05)

    assert approved >= 1  # the coordinator's start_import asks first
    moved = {child: seen for child, seen in values.items() if len(seen) >= 2}
    assert moved, f"no progress bar changed value: {values}"
    assert all(0 <= v <= 1 for seen in values.values() for v in seen)
    assert answer.startswith("HTTP/3 vs gRPC:")
    assert "RPC framework on HTTP/2" in answer
    assert browser.find_element(By.ID, "run-status").text == "completed"
    milestones = [m.get_attribute("data-name") for m in browser.find_elements(By.CSS_SELECTOR, ".milestone")]
    assert "sources_read" in milestones
    calls = [c.text for c in browser.find_elements(By.CSS_SELECTOR, ".call .call-name")]
    assert calls.count("research") == 2 and "start_import" in calls


def test_a_child_runs_approval_is_shown_and_approved_on_the_parents_page(webapp: WebApp, browser: Any) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    browser.get(webapp.url + "/")
    agent = browser.find_element(By.ID, "agent")
    agent.clear()
    agent.send_keys("child_approval_parent")
    browser.find_element(By.ID, "message").send_keys("go")
    browser.find_element(By.ID, "start").click()
    eventually(lambda: "/runs/run_" in browser.current_url, what="the redirect to the run's page")

    def approve_child_entry() -> str | None:
        # Found and pressed in one go: if the list is redrawn between the two (a status change
        # came in), the entry is looked up again rather than pressed through a stale reference.
        try:
            items = browser.find_elements(By.CSS_SELECTOR, "#approvals .pending")
            item = next(
                (i for i in items if i.is_displayed() and "in child run of child_approval_child" in i.text), None
            )
            buttons = item.find_elements(By.CSS_SELECTOR, "button.button-approve") if item is not None else []
            if item is None or not buttons:
                return None
            text = str(item.text)
            buttons[0].click()
            return text
        except StaleElementReferenceException:
            return None

    text = eventually(approve_child_entry, what="the child's call listed on the parent's page, and approved")
    assert "send_note" in text
    answer = eventually(lambda: browser.find_element(By.ID, "final-answer").text, what="the parent's final answer")
    assert answer == "parent done"
