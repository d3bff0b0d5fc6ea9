"""The operations console as a person uses it, in headless Chromium (one browser for the module).

The API (with the console at ``/console``) is served by uvicorn in a thread of this process, on
an embedded runtime (SQLite, the in-process worker) with the scripted agents of
``tests.support.console_agents``; Selenium drives Debian's ``chromium`` and ``chromedriver``.
A person signs in with a token, finds a child run's call in the inbox, edits its arguments and
approves them, resolves a parked call, watches the model's text appear while it is written, sets
a secret variable, and watches a run finish without reloading the page. Every text a model or
tool wrote carries markup that would set ``window.__pwned`` if it ran; it never does.

``THREADS_CONSOLE_SCREENSHOTS=1`` writes the screenshots of docs/console.md into docs/images/.
Without Chromium the module skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from cryptography.fernet import Fernet

from tests.support import console_agents
from tests.support.console_agents import PAYLOAD
from tests.support.processes import REPO_ROOT, free_port
from tests.support.services import require_service
from tests.support.waiting import eventually
from threads_celery import Threads
from threads_celery.api.app import create_api
from threads_celery.settings import Settings

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
)
ALICE = "tok-alice-browser-0123"
BOB = "tok-bob-browser-0123"
SECRET = "sk-live-browser-secret-7777"
WAIT_S = 30.0
SCREENSHOTS = REPO_ROOT / "docs" / "images"

pytestmark = pytest.mark.acceptance


@dataclass
class Console:
    url: str
    threads: Threads


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    previous = os.environ.get("THREADS_SECRET_KEY")
    os.environ["THREADS_SECRET_KEY"] = Fernet.generate_key().decode()
    workdir = tmp_path_factory.mktemp("console-browser")
    try:
        # THREADS_AGENTS names the agents' module, as a deployment would: its SCHEDULES are listed.
        settings = Settings.from_env(env={"THREADS_AGENTS": "tests.support.console_agents"})
        with Threads.embedded(workdir / "threads.db", settings=settings) as threads:
            for agent in console_agents.AGENTS:
                threads.register(agent)
            app = create_api(threads, tokens=[f"alice@acme={ALICE}", f"bob@globex={BOB}"], poll_interval_s=0.1)
            port = free_port()
            server = uvicorn.Server(
                uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2)
            )
            serving = threading.Thread(target=server.run, name="console-server", daemon=True)
            serving.start()
            try:
                eventually(lambda: server.started, timeout=WAIT_S, what="the console's server")
                yield Console(f"http://127.0.0.1:{port}/console", threads)
            finally:
                server.should_exit = True
                serving.join(10)
    finally:
        if previous is None:
            os.environ.pop("THREADS_SECRET_KEY", None)
        else:
            os.environ["THREADS_SECRET_KEY"] = previous


@pytest.fixture(scope="module")
def browser(console: Console, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    found = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()
    require_service(
        "Chromium", found, f"{CHROMIUM} and {CHROMEDRIVER} are needed (apt-get install chromium chromium-driver)"
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in BROWSER_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(browser: Any, name: str) -> None:
    """Docs' screenshots, when asked for; the page is sized to its content first."""
    if os.environ.get("THREADS_CONSOLE_SCREENSHOTS", "") not in ("1", "true"):
        return
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(max(height + 40, 600), 2400))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / f"console-{name}.png"))
    browser.set_window_size(1280, 1000)


def by_css(browser: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, selector)


def nothing_ran(browser: Any) -> None:
    assert browser.execute_script("return window.__pwned === undefined"), "markup from a model or tool ran"


def card_in_inbox(browser: Any, console: Console, effect_key: str) -> Any:
    """The inbox's card of a call, reloading the inbox until it is there."""
    from selenium.webdriver.common.by import By

    def found() -> Any:
        browser.get(f"{console.url}/inbox")
        cards = browser.find_elements(By.CSS_SELECTOR, f'article[data-effect-key="{effect_key}"]')
        return cards[0] if cards else None

    return eventually(found, timeout=WAIT_S, what=f"{effect_key} in the inbox")


def start(console: Console, agent: str, message: str = "go") -> str:
    return console.threads.start(agent, message, tenant="acme").run_id


def text_of(browser: Any, selector: str, attribute: str | None = None) -> str | None:
    """An element's text (or attribute) now, or None while the page has none (it may be loading)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        found = browser.find_elements(By.CSS_SELECTOR, selector)
        if not found:
            return None
        return str(found[0].get_attribute(attribute) if attribute else found[0].text)
    except StaleElementReferenceException:
        return None  # replaced while read: the next probe reads the new one


def signed_in_as(browser: Any) -> str | None:
    return text_of(browser, "#principal")


def finished(console: Console, run_id: str) -> None:
    """The run completed (``Threads.wait`` would return at once: the run waits for a person)."""
    eventually(lambda: console.threads.get_run(run_id).status == "completed", timeout=WAIT_S, what="the run's end")


def status_shown(browser: Any) -> str | None:
    return text_of(browser, "#run-status", "data-status")


# -- the scenario, in order: one browser, signed in once ----------------------------------------


def test_a_wrong_token_stays_at_sign_in_and_the_right_one_signs_in(console: Console, browser: Any) -> None:
    browser.get(f"{console.url}/")
    assert browser.current_url.endswith("/console/sign-in")
    by_css(browser, "#token").send_keys("not-a-token")
    by_css(browser, "#sign-in").click()
    assert "not valid" in by_css(browser, "#sign-in-error").text
    screenshot(browser, "sign-in")
    by_css(browser, "#token").send_keys(ALICE)
    by_css(browser, "#sign-in").click()
    eventually(lambda: signed_in_as(browser) == "alice", timeout=WAIT_S, what="alice signed in")
    assert by_css(browser, "#tenant").text == "acme"


def test_a_child_runs_call_is_found_in_the_inbox_edited_and_approved(console: Console, browser: Any) -> None:
    run_id = start(console, "console_parent", f"send a note {PAYLOAD}")
    [call] = eventually(lambda: console.threads.pending(run_id), timeout=WAIT_S, what="the child's call")
    card = card_in_inbox(browser, console, call.effect_key)
    nothing_ran(browser)
    assert "a child of run" in card.text and run_id in card.text
    assert "<script>window.__pwned" in card.find_element("css selector", "textarea").get_attribute("value")
    screenshot(browser, "inbox")
    arguments = card.find_element("css selector", "textarea")
    arguments.clear()
    arguments.send_keys(json.dumps({"text": 5}))
    card.find_element("css selector", "button.approve-button").click()
    # Refused: back on the inbox (a GET: a reload sends nothing again), saying why, the draft kept.
    eventually(lambda: "?notice=" in browser.current_url, timeout=WAIT_S, what="the refusal's page")
    assert "/console/inbox?notice=" in browser.current_url and "text" in by_css(browser, "#action-error").text
    browser.refresh()
    card = by_css(browser, f'article[data-effect-key="{call.effect_key}"]')
    arguments = card.find_element("css selector", "textarea")
    assert json.loads(arguments.get_attribute("value")) == {"text": 5}
    arguments.clear()
    arguments.send_keys(json.dumps({"text": "edited by alice"}))
    card.find_element("css selector", "button.approve-button").click()
    eventually(lambda: console.threads.get_run(run_id).is_terminal, timeout=WAIT_S, what="the parent run's end")
    assert browser.current_url.endswith("/console/inbox") and "Not found" not in by_css(browser, "main").text
    assert "edited by alice" in console_agents.SENT

    browser.get(f"{console.url}/runs/{run_id}")
    eventually(lambda: status_shown(browser) == "completed", timeout=WAIT_S, what="the run page saying completed")
    nothing_ran(browser)
    assert PAYLOAD in by_css(browser, "#run-output").text  # the markup is there, as text
    child = by_css(browser, "li[data-child-run] a")
    child_id = child.text
    child.click()
    eventually(lambda: text_of(browser, "#run-id") == child_id, timeout=WAIT_S, what="the child run's page")
    assert "approved by alice" in by_css(browser, "#timeline").text
    assert "sent edited by alice" in by_css(browser, "#timeline").get_attribute("textContent")
    nothing_ran(browser)
    screenshot(browser, "child-run")


def test_a_parked_call_is_resolved(console: Console, browser: Any) -> None:
    run_id = start(console, "console_payments")
    assert console.threads.wait(run_id, WAIT_S).status == "parked"
    [call] = console.threads.pending(run_id)
    card = card_in_inbox(browser, console, call.effect_key)
    assert "the gateway timed out" in card.text
    card.find_element("css selector", 'input[value="assume_done"]').click()
    card.find_element("css selector", 'input[name="reason"]').send_keys("the bank shows the charge")
    screenshot(browser, "parked")
    card.find_element("css selector", "button.resolve-button").click()
    finished(console, run_id)
    browser.get(f"{console.url}/runs/{run_id}")
    assert "assume_done by alice" in by_css(browser, "#timeline").text


def test_the_models_text_shows_while_it_is_written(console: Console, browser: Any) -> None:
    # Before the secret variable's test: a worker that has decrypted a secret holds back what
    # it streams (redaction), and this wants the text to arrive in pieces.
    run_id = start(console, "console_writer")
    browser.get(f"{console.url}/runs/{run_id}")
    whole = console_agents.LONG_REPLY.strip()
    partial = eventually(
        lambda: (text := text_of(browser, "#live-text")) and 60 <= len(text) < len(whole) and text,
        timeout=WAIT_S,
        what="part of the reply under Being written",
    )
    assert whole.startswith(partial) and status_shown(browser) == "running"
    screenshot(browser, "live-text")
    eventually(lambda: status_shown(browser) == "completed", timeout=WAIT_S, what="the run's end")
    assert not by_css(browser, "#live-text-section").is_displayed()
    assert whole in by_css(browser, "#run-output").text


def test_a_secret_variable_is_set_in_place_and_never_shown(console: Console, browser: Any) -> None:
    run_id = start(console, "console_keyed")
    assert console.threads.wait(run_id, WAIT_S).status == "awaiting_variable"
    [call] = console.threads.pending(run_id)
    card = card_in_inbox(browser, console, call.effect_key)
    field = card.find_element("css selector", 'form[data-variable="API_KEY"] input[name="value"]')
    assert field.get_attribute("type") == "password"
    field.send_keys(SECRET)
    card.find_element("css selector", "button.set-button").click()
    finished(console, run_id)
    for page in (f"/runs/{run_id}", "/inbox", "/"):
        browser.get(console.url + page)
        assert SECRET not in browser.page_source, page


def test_a_person_watches_a_run_finish_without_reloading(console: Console, browser: Any) -> None:
    console_agents.GO.clear()
    run_id = start(console, "console_slow")
    eventually(
        lambda: any(
            e.type == "tool_call_started" for e in console.threads.events(console.threads.get_run(run_id).thread_id)
        ),
        timeout=WAIT_S,
        what="wait_for_go started",
    )
    browser.get(f"{console.url}/runs/{run_id}")
    assert status_shown(browser) == "running"
    browser.execute_script("window.__samePage = true")
    console_agents.GO.set()
    eventually(lambda: status_shown(browser) == "completed", timeout=WAIT_S, what="the page showing completed")
    assert browser.execute_script("return window.__samePage === true"), "the page was reloaded"
    assert "finished" in by_css(browser, "#run-output").text
    screenshot(browser, "run")
    browser.get(f"{console.url}/")
    nothing_ran(browser)
    screenshot(browser, "runs")
    browser.get(f"{console.url}/agents")
    assert "nightly-digest" in by_css(browser, "#schedules").text
    screenshot(browser, "agents")


def test_another_tenants_run_and_an_ended_session(console: Console, browser: Any) -> None:
    run_id = start(console, "console_parent")
    browser.delete_all_cookies()
    browser.get(f"{console.url}/sign-in")
    by_css(browser, "#token").send_keys(BOB)
    by_css(browser, "#sign-in").click()
    eventually(lambda: signed_in_as(browser) == "bob", timeout=WAIT_S, what="bob signed in")
    browser.get(f"{console.url}/runs/{run_id}")
    theirs = by_css(browser, "main").text
    browser.get(f"{console.url}/runs/run_that_nobody_has")
    assert by_css(browser, "main").text == theirs and "Not found" in theirs
    browser.add_cookie({"name": "threads_console", "value": "1.forged", "path": "/console/"})
    browser.get(f"{console.url}/inbox")
    assert browser.current_url.endswith("/console/sign-in") and "Traceback" not in browser.page_source
