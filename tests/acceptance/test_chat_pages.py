"""The chat protocols with the real npm clients, in headless Chromium.

Two pages in tests/acceptance/chat_pages: one built on the AI SDK's ``useChat`` (``ai`` and
``@ai-sdk/react``), one on ``@ag-ui/client``'s ``HttpAgent``. Their packages are installed from the
npm registry into that folder (``npm ci``, pinned by its package-lock.json, once: a stamp keeps
the install until the lock changes) and bundled with esbuild by this module; neither the packages
nor the bundles are committed. The API serves the pages itself (same origin), from an embedded
runtime whose scripted model streams slowly enough to watch.

Each page: the reply's text appears in several renders before the run ends, a tool call shows
as it starts (before its result), an approval round trip works, and a reload mid-turn resumes.
Without node/npm or Chromium the module skips locally and fails under CI.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from tests.support.processes import free_port
from tests.support.services import require_service
from tests.support.waiting import eventually
from threads_celery import Agent, Threads, tool
from threads_celery.api.app import create_api
from threads_celery.testing import ScriptedModel, call, say

PAGES = Path(__file__).resolve().parent / "chat_pages"
TOKEN = "pages-token-0123456789"
#: A caller of another tenant, for the tenancy of the streamed deltas.
OTHER_TOKEN = "pages-token-globex"
WAIT_S = 30.0
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
REPLY = "It is twenty-one degrees in Paris, with a clear sky all afternoon."
#: How long the scripted model waits between the pieces it streams, and the slow tool runs.
PIECE_S = 0.12
TOOL_S = 2.0


class CityIn(BaseModel):
    city: str


class EmailIn(BaseModel):
    to: str


def _weather(inp: CityIn, ctx: Any) -> str:
    time.sleep(TOOL_S)  # slow enough to see the call before its result, and to reload meanwhile
    return f"21 degrees in {inp.city}"


def _send(inp: EmailIn, ctx: Any) -> str:
    return f"sent to {inp.to}"


weather = tool(name="weather", description="The weather.", input=CityIn, execute=_weather, effect="read_only")
send_email = tool(name="send_email", description="Send an email.", input=EmailIn, execute=_send)
forecaster = Agent(
    name="pages_weather",
    instructions="Answer.",
    model=ScriptedModel([call("weather", city="Paris"), say(REPLY)], chunk_size=4, chunk_delay_s=PIECE_S),
    tools=[weather],
)
mailer = Agent(
    name="pages_mailer",
    instructions="Mail.",
    model=ScriptedModel(
        [call("send_email", to="ann@example.com"), say("Sent it to Ann.")], chunk_size=4, chunk_delay_s=PIECE_S
    ),
    tools=[send_email],
)

replies: list[str] = []


def _numbered(messages: list[Any]) -> str:
    """A reply that names itself and the message it answers (the last user prompt it was given)."""
    said = [str(p.content) for m in messages for p in m.parts if getattr(p, "part_kind", "") == "user-prompt"]
    replies.append(f"Reply {len(replies) + 1}: you said {said[-1]}.")
    return replies[-1]


numbered = Agent(
    name="pages_numbered",
    instructions="Answer.",
    model=ScriptedModel([_numbered], chunk_size=4, chunk_delay_s=PIECE_S / 4),
)


# -- the pages, built here ------------------------------------------------------------------------


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, cwd=PAGES, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


@pytest.fixture(scope="module")
def pages() -> Path:
    """The pages' folder with its npm packages installed and both bundles built."""
    npm, node = shutil.which("npm"), shutil.which("node")
    require_service("Node.js", bool(npm and node), "node and npm are needed on PATH to build the chat pages")
    assert npm is not None
    lock = (PAGES / "package-lock.json").read_bytes()
    stamp = PAGES / "node_modules" / ".threads-lock-sha256"
    digest = hashlib.sha256(lock).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        _run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"], "npm ci")
        stamp.write_text(digest)
    esbuild = str(PAGES / "node_modules" / ".bin" / "esbuild")
    common = ["--bundle", '--define:process.env.NODE_ENV="production"', "--log-level=warning"]
    _run([esbuild, "src/vercel.jsx", "--jsx=automatic", "--outfile=dist/vercel.js", *common], "esbuild (useChat page)")
    _run([esbuild, "src/agui.js", "--outfile=dist/agui.js", *common], "esbuild (AG-UI page)")
    return PAGES


class Server:
    def __init__(self, threads: Threads, url: str) -> None:
        self.threads, self.url = threads, url

    def page(self, name: str, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"token": TOKEN, **params}.items())
        return f"{self.url}/pages/{name}.html?{query}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Threads.embedded() as threads:
        for agent in (forecaster, mailer, numbered):
            threads.register(agent)
        app = create_api(threads, tokens=[TOKEN, f"bob@globex={OTHER_TOKEN}"], poll_interval_s=0.02)
        app.mount("/pages", StaticFiles(directory=PAGES), name="pages")
        port = free_port()
        uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=uv.run, name="chat-pages-api", daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(up, timeout=WAIT_S, what="the API to answer")
        try:
            yield Server(threads, url)
        finally:
            uv.should_exit = True
            thread.join(10)


@pytest.fixture
def browser(pages: Path) -> Iterator[Any]:
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
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


# -- driving a page ----------------------------------------------------------------------------------


def chat_log(browser: Any) -> dict[str, Any]:
    found: dict[str, Any] = browser.execute_script("return window.chatLog || {}")
    return found


def send(browser: Any, text: str) -> None:
    from selenium.webdriver.common.by import By

    eventually(lambda: chat_log(browser).get("renders"), timeout=WAIT_S, what="the page to render")
    browser.find_element(By.ID, "input").send_keys(text)
    browser.find_element(By.ID, "send").click()


def page_text(browser: Any) -> str:
    """The assistant's text on the page, read in one script (the page re-renders as it streams)."""
    script = "return [...document.querySelectorAll('.message.assistant .text')].map(e => e.textContent).join(' ')"
    text: str = browser.execute_script(script)
    return text


def shown_messages(browser: Any) -> list[tuple[str, str]]:
    """Each message on the page: its role and its text."""
    script = """return [...document.querySelectorAll('.message')].map(
        m => [m.classList[1], [...m.querySelectorAll('.text')].map(t => t.textContent).join('')])"""
    return [tuple(m) for m in browser.execute_script(script)]


def wait_for_text(browser: Any, text: str) -> None:
    eventually(
        lambda: text in page_text(browser),
        timeout=WAIT_S,
        what=f"{text!r} on the page",
        detail=lambda: chat_log(browser),
    )


def run_of(server: Server, thread_id: str) -> Any:
    [run] = server.threads.runs(thread_id=thread_id)
    return run


def assert_text_grew_in_steps(log: dict[str, Any], final: str) -> None:
    """The reply's text was shown partly, in several renders, each a longer start of the final text."""
    partial = [t for t in log["texts"] if final.startswith(t) and t != final]
    assert len(partial) >= 3, log["texts"]
    assert [len(t) for t in partial] == sorted({len(t) for t in partial}), log["texts"]


# -- useChat ----------------------------------------------------------------------------------------


def test_usechat_shows_the_reply_as_it_is_written_and_tool_calls_as_they_start(server: Server, browser: Any) -> None:
    chat = f"chat-{uuid.uuid4().hex[:10]}"
    browser.get(server.page("vercel", agent="pages_weather", chat=chat))
    send(browser, "weather in Paris?")
    wait_for_text(browser, REPLY)
    log = chat_log(browser)
    [states] = log["toolStates"].values()
    # The call is on the page while the tool runs (input), then with its output.
    assert states.index("input-available") < states.index("output-available"), states
    assert_text_grew_in_steps(log, REPLY)
    assert run_of(server, chat).status == "completed"
    assert not log["errors"], log["errors"]


def test_usechat_approval_round_trip(server: Server, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    chat = f"chat-{uuid.uuid4().hex[:10]}"
    browser.get(server.page("vercel", agent="pages_mailer", chat=chat))
    send(browser, "mail ann")
    button = eventually(
        lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), timeout=WAIT_S, what="Approve"
    )
    assert run_of(server, chat).status == "awaiting_approval"
    button[0].click()
    wait_for_text(browser, "Sent it to Ann.")
    assert run_of(server, chat).status == "completed"
    [states] = chat_log(browser)["toolStates"].values()
    assert states[-1] == "output-available" and "approval-requested" in states, states
    [call] = [m for m in server.threads.messages(chat) if m.role == "tool"]
    assert call.text == "sent to ann@example.com"


def test_usechat_reload_mid_turn_resumes(server: Server, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    chat = f"chat-{uuid.uuid4().hex[:10]}"
    url = server.page("vercel", agent="pages_weather", chat=chat)
    browser.get(url)
    send(browser, "weather in Paris?")
    eventually(
        lambda: browser.find_elements(By.CSS_SELECTOR, ".tool[data-state=input-available]"),
        timeout=WAIT_S,
        what="the call",
    )
    browser.get(url)  # a reload while the tool runs: the page loads the history, then resumes the reply
    wait_for_text(browser, REPLY)
    log = chat_log(browser)
    assert log["renders"] > 1 and log["texts"][-1] == REPLY
    assert run_of(server, chat).status == "completed"
    assert len(server.threads.runs(thread_id=chat)) == 1
    assert shown_messages(browser) == [("user", "weather in Paris?"), ("assistant", REPLY)]
    browser.get(url)  # and once it is over, the history alone shows the whole conversation
    eventually(lambda: REPLY in page_text(browser), timeout=WAIT_S, what="the history on the page")
    assert shown_messages(browser) == [("user", "weather in Paris?"), ("assistant", REPLY)]
    assert not chat_log(browser)["errors"]


def committed(server: Server, chat: str) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in server.threads.messages(chat) if m.text]


def settled(browser: Any, server: Server, chat: str, count: int) -> None:
    """Wait until the page is ready and shows ``count`` messages, the same as the ledger's."""
    from selenium.webdriver.common.by import By

    eventually(
        lambda: (
            [e.text for e in browser.find_elements(By.ID, "status")] == ["ready"]
            and len(shown_messages(browser)) == count
            and shown_messages(browser) == committed(server, chat)
        ),
        timeout=WAIT_S,
        what=f"{count} messages on the page, as the ledger holds them",
        detail=lambda: (shown_messages(browser), committed(server, chat), chat_log(browser)),
    )


def test_usechat_regenerate_and_edit_branch_the_thread(server: Server, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    chat = f"chat-{uuid.uuid4().hex[:10]}"
    url = server.page("vercel", agent="pages_numbered", chat=chat)
    browser.get(url)
    send(browser, "first")
    settled(browser, server, chat, 2)
    send(browser, "second")
    settled(browser, server, chat, 4)
    [u, a, b_user, b] = shown_messages(browser)
    # useChat's regenerate(): [U, A, U2, B] gives [U, A, U2, B'], streamed as the ledger committed it.
    browser.find_element(By.ID, "regenerate").click()
    eventually(lambda: shown_messages(browser)[-1] not in (b, ("assistant", "")), timeout=WAIT_S, what="B'")
    settled(browser, server, chat, 4)
    [u2, a2, b_user2, b_again] = shown_messages(browser)
    assert (u2, a2, b_user2) == (u, a, b_user) and b_again != b and b_again[1].endswith("you said second.")
    browser.get(url)  # a reload shows the new branch, from the server's history
    settled(browser, server, chat, 4)
    assert shown_messages(browser)[-1] == b_again
    # Editing the first message drops everything after it; the model answers the new text.
    browser.find_element(By.ID, "input").send_keys("first, edited")
    browser.find_elements(By.CSS_SELECTOR, ".message.user button.edit")[0].click()
    settled(browser, server, chat, 2)
    assert shown_messages(browser)[0] == ("user", "first, edited")
    assert shown_messages(browser)[1][1].endswith("you said first, edited.")
    browser.get(url)
    settled(browser, server, chat, 2)
    assert [b.kind for b in server.threads.branches(chat)] == ["regenerate", "edit"]
    assert not chat_log(browser)["errors"], chat_log(browser)["errors"]


# -- AG-UI -----------------------------------------------------------------------------------------


def test_ag_ui_shows_the_reply_as_it_is_written_and_tool_calls_as_they_start(server: Server, browser: Any) -> None:
    thread = str(uuid.uuid4())
    browser.get(server.page("agui", agent="pages_weather", thread=thread))
    send(browser, "weather in Paris?")
    wait_for_text(browser, REPLY)
    log = chat_log(browser)
    [states] = log["toolStates"].values()
    assert states == ["started", "result"], states
    assert log["toolStarts"] == ["weather"]
    assert_text_grew_in_steps(log, REPLY)
    assert run_of(server, thread).status == "completed"
    assert not log["errors"], log["errors"]


def test_ag_ui_approval_round_trip(server: Server, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    thread = str(uuid.uuid4())
    browser.get(server.page("agui", agent="pages_mailer", thread=thread))
    send(browser, "mail ann")
    button = eventually(
        lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), timeout=WAIT_S, what="Approve"
    )
    assert chat_log(browser)["outcomes"][-1] == "interrupt"
    button[0].click()
    wait_for_text(browser, "Sent it to Ann.")
    assert run_of(server, thread).status == "completed"
    assert not chat_log(browser)["errors"]


def test_ag_ui_reload_mid_turn_resumes(server: Server, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    thread = str(uuid.uuid4())
    browser.get(server.page("agui", agent="pages_weather", thread=thread))
    send(browser, "weather in Paris?")
    eventually(
        lambda: browser.find_elements(By.CSS_SELECTOR, ".tool[data-state=started]"), timeout=WAIT_S, what="the call"
    )
    browser.get(server.page("agui", agent="pages_weather", thread=thread, attach="1"))
    wait_for_text(browser, REPLY)
    log = chat_log(browser)
    assert log["toolStarts"] == ["weather"] and log["texts"][-1] == REPLY
    assert run_of(server, thread).status == "completed"
    assert not log["errors"], log["errors"]


# -- a client that goes away ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["vercel-ai", "ag-ui"])
def test_a_chat_client_that_disconnects_mid_reply_leaves_no_subscription(server: Server, protocol: str) -> None:
    hub = server.threads.live_hub
    thread, message = f"chat-{uuid.uuid4().hex[:10]}", f"m-{uuid.uuid4().hex[:10]}"
    if protocol == "vercel-ai":
        parts = [{"type": "text", "text": "weather?"}]
        body: dict[str, Any] = {
            "id": thread,
            "trigger": "submit-message",
            "messages": [{"id": message, "role": "user", "parts": parts}],
        }
        first_delta = '"type":"tool-input-delta"'
    else:
        body = {
            "threadId": thread, "runId": "r1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": message, "role": "user", "content": "weather?"}],
        }  # fmt: skip
        first_delta = '"type":"TOOL_CALL_ARGS"'
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{server.url}/v1/chat/{protocol}/pages_weather"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=WAIT_S) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if first_delta in line:
                assert hub.subscriber_count >= 1
                break
    eventually(
        lambda: hub.subscriber_count == 0 and hub.channel_count == 0,
        timeout=10,
        what="the subscription removed",
        detail=lambda: (hub.subscriber_count, hub.channel_count),
    )
    # The run goes on without its client.
    assert server.threads.wait(message, WAIT_S).status == "completed"


def test_two_tenants_on_the_same_chat_id_each_stream_only_their_own_deltas(server: Server) -> None:
    """The chat id names a thread of each caller's own: both stream at once, neither sees the other's text."""
    chat = f"chat-{uuid.uuid4().hex[:10]}"
    replies: dict[str, str] = {}

    def converse(token: str, agent: str, text: str) -> None:
        message = {"id": f"m-{uuid.uuid4().hex[:10]}", "role": "user", "parts": [{"type": "text", "text": text}]}
        body = {"id": chat, "trigger": "submit-message", "messages": [message]}
        headers = {"Authorization": f"Bearer {token}"}
        url = f"{server.url}/v1/chat/vercel-ai/{agent}"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=WAIT_S) as response:
            replies[token] = "".join(response.iter_text())

    both = [
        threading.Thread(target=converse, args=(TOKEN, "pages_weather", "weather?")),
        threading.Thread(target=converse, args=(OTHER_TOKEN, "pages_mailer", "mail ann")),
    ]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(WAIT_S)
    ours, theirs = replies[TOKEN], replies[OTHER_TOKEN]
    assert '"type":"text-delta"' in ours and "twenty-one" not in theirs and "weather" not in theirs
    assert "send_email" in theirs and "send_email" not in ours
    assert ours.count('"threadId":"' + chat + '"') == 1 == theirs.count('"threadId":"' + chat + '"')
