"""Secrets with newlines, quotes, backslashes and non-ASCII never leave a tool call in any encoding.

The pure part: :func:`rendered_forms` and friends against every way Python and JSON print a
string. The end-to-end part: a tool reads a hostile secret and returns it inside a dict, raises
it as ``KeyError`` and in a ``repr``, logs it, prints it, reports it as progress; the canary must
appear in no table, event, log record, captured output or CLI output.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel
from sqlalchemy import select

from threads_celery import Agent, Threads, tool
from threads_celery.definitions.tools import render_result
from threads_celery.definitions.variables import Variable
from threads_celery.redaction import (
    REDACTED,
    describe_exception,
    redact_record,
    redact_text,
    redact_value,
    rendered_forms,
)
from threads_celery.store import schema
from threads_celery.testing import ScriptedModel, call, say

PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7canaryline1\n"
    "q\"uo'te\\back\\slash-é€-ünïcødé-canaryline2\n"
    "-----END PRIVATE KEY-----\n"
)
HOSTILE = [
    PEM,
    "sk-\"quoted\"-'single'-canary",
    "sk-back\\slash\\n-not-a-newline-canary",
    "sk-ünïcødé-€-日本-canary",
    "tab\there\r\nand-crlf-canary",
]


def leaks(text: str, secret: str) -> list[str]:
    """The pieces of ``secret`` (whole, or a distinctive line) still visible in ``text``."""
    pieces = [secret] + [line for line in secret.splitlines() if "canary" in line]
    return [p for p in pieces if p in text]


# -- pure ----------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", HOSTILE)
def test_every_rendering_of_the_secret_is_redacted(secret: str) -> None:
    renderings = [
        secret,
        json.dumps(secret),
        json.dumps(secret, ensure_ascii=False),
        json.dumps(json.dumps({"k": secret})),  # JSON inside JSON
        repr(secret),
        ascii(secret),
        repr(secret.encode()),
        str(KeyError(secret)),
        f"failed: {secret!r} and {[secret]}",
        render_result({"key": secret, "nested": [{"k": secret}]}),
        render_result([secret.encode()]) if secret.isascii() else render_result([secret]),
    ]
    for text in renderings:
        clean = redact_text(f"before {text} after", [secret])
        assert clean.startswith("before ") and clean.endswith(" after")
        assert REDACTED in clean, text
        for form in (secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], ascii(secret)[1:-1]):
            assert form not in clean, (text, clean)


def test_each_line_of_a_multi_line_secret_is_redacted_on_its_own() -> None:
    line = PEM.splitlines()[1]
    assert redact_text(f"traceback shows only {line} here", [PEM]) == f"traceback shows only {REDACTED} here"
    # Short lines would blank out ordinary text: they are not fragments on their own.
    assert redact_text("a b c", ["a\nb\nsecret-value"]) == "a b c"


def test_redact_value_walks_results_before_they_are_serialised() -> None:
    class Out(BaseModel):
        key: str
        items: list[str]

    secret = HOSTILE[1]
    value = {"outer": (secret, {secret: [Out(key=secret, items=[f"x{secret}y"])]}), "n": 3, "set": {secret}}
    clean = redact_value(value, [secret])
    assert clean == {
        "outer": (REDACTED, {REDACTED: [{"key": REDACTED, "items": [f"x{REDACTED}y"]}]}),
        "n": 3,
        "set": [REDACTED],
    }
    assert redact_value(value, []) is value  # nothing revealed: untouched


@pytest.mark.parametrize("secret", HOSTILE)
def test_exception_messages_are_redacted_from_their_arguments_and_their_text(secret: str) -> None:
    for exc in (KeyError(secret), ValueError(f"bad key {secret!r}"), RuntimeError("x", {"k": secret})):
        text = describe_exception(exc, [secret])
        assert text.startswith(type(exc).__name__ + ": ")
        assert not leaks(text, secret) and repr(secret)[1:-1] not in text, text


def test_a_log_record_is_rewritten_so_no_handler_can_format_the_secret() -> None:
    secret = PEM
    try:
        raise KeyError(secret)
    except KeyError:
        record = logging.LogRecord(
            "tool", logging.ERROR, __file__, 1, "key=%s data=%r", (secret, {"k": secret}), sys.exc_info()
        )
    redact_record(record, [secret])
    formatted = logging.Formatter("%(message)s").format(record)
    assert "key=***" in formatted and "Traceback" in formatted
    assert not leaks(formatted, secret) and repr(secret)[1:-1] not in formatted


def test_forms_are_bounded_and_longest_first() -> None:
    forms = rendered_forms(PEM)
    assert forms[0] == max(forms, key=len) and PEM in forms
    assert all(len(f) >= 6 for f in forms)


# -- end to end (embedded runtime: real worker machinery on SQLite) --------------------------


class Q(BaseModel):
    how: str


def _leaky(inp: Q, ctx: Any) -> Any:
    secret = ctx.env("PRIVATE_KEY")
    logging.getLogger("my.tool").warning("using key %s / %r", secret, secret)
    logging.getLogger("my.tool").info("as json: %s", json.dumps({"k": secret}))
    print(f"tool prints {secret}")
    print(repr(secret), file=sys.stderr)
    if inp.how == "dict":
        return {"key": secret, "lines": secret.splitlines(), "json": json.dumps(secret)}
    if inp.how == "keyerror":
        raise KeyError(secret)
    if inp.how == "logged_exception":
        try:
            raise ValueError(f"bad key {secret!r}")
        except ValueError:
            logging.getLogger("my.tool").exception("failed with %s", secret)
            raise
    raise AssertionError(inp.how)


leaky = tool(
    name="leaky",
    description="Uses a private key carelessly.",
    input=Q,
    effect="read_only",
    execute=_leaky,
    variables=[Variable("PRIVATE_KEY", "secret", required=True)],
)


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADS_SECRET_KEY", Fernet.generate_key().decode())


@pytest.mark.parametrize("secret", [HOSTILE[0], HOSTILE[1], HOSTILE[3]], ids=["pem", "quotes", "non-ascii"])
def test_a_hostile_secret_leaks_into_no_table_event_log_output_or_cli(
    secret: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "ledger.db"
    agent = Agent(
        name="leaker",
        instructions="x",
        model=ScriptedModel(
            [
                call("leaky", how="dict"),
                call("leaky", how="keyerror"),
                call("leaky", how="logged_exception"),
                say("done"),
            ]
        ),
        tools=[leaky],
    )
    with Threads.embedded(path=db) as threads:
        run = threads.wait(threads.start(agent, "go", env={"PRIVATE_KEY": secret}).run_id, 30)
        assert run.status == "completed", run.error
        results = [m.tool_result for m in threads.messages(run.thread_id) if m.role == "tool"]
        assert [r.is_error for r in results if r] == [False, True, True]
        dump: list[str] = []
        with threads.store.read() as tx:
            for table in schema.metadata.sorted_tables:
                dump.extend(str(tuple(row)) for row in tx.conn.execute(select(table)))
        dump.extend(json.dumps(e.payload, ensure_ascii=False) for e in threads.events(run.thread_id))
        dump.extend(json.dumps(e.payload) for e in threads.events(run.thread_id))
    text = "\n".join(dump)
    assert "***" in text and "KeyError" in text
    assert not leaks(text, secret), "secret in the ledger or events"
    for form in (json.dumps(secret)[1:-1], repr(secret)[1:-1], ascii(secret)[1:-1]):
        assert form not in text
    out, err = capfd.readouterr()
    assert "tool prints ***" in out + err + caplog.text or "tool prints ***" in out + err
    for stream in (out, err, caplog.text):
        assert not leaks(stream, secret) and repr(secret)[1:-1] not in stream, stream[-2000:]
    assert "using key ***" in caplog.text and "failed with ***" in caplog.text
    for argv in (["runs", "show", run.id, "--json"], ["runs", "show", run.id], ["events", run.thread_id]):
        cli = subprocess.run(
            [str(Path(sys.executable).parent / "threads-celery"), *argv],
            env={"PATH": "/usr/bin:/bin", "THREADS_DATABASE_URL": f"sqlite:///{db}", "COLUMNS": "400"},
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert cli.returncode == 0, (argv, cli.stderr)
        assert "***" in cli.stdout, (argv, cli.stdout)
        assert not leaks(cli.stdout + cli.stderr, secret), argv


def _reporting(inp: Q, ctx: Any) -> str:
    secret = ctx.env("PRIVATE_KEY")
    ctx.report_progress(fraction=0.5, message=f"using {secret}", phase=secret)
    ctx.report_progress(milestone="keyed", data={"key": secret, "lines": secret.splitlines()}, persist=True)
    return "reported"


reporting = tool(
    name="reporting", description="Reports progress carelessly.", input=Q, effect="read_only",
    execute=_reporting, variables=[Variable("PRIVATE_KEY", "secret", required=True)],
)  # fmt: skip


def test_progress_and_milestones_a_tool_reports_are_redacted_too() -> None:
    from threads_celery import agent_tool

    secret = PEM
    child = Agent(
        name="reporter_child",
        instructions="x",
        model=ScriptedModel([call("reporting", how="x"), say("child done")]),
        tools=[reporting],
    )
    parent = Agent(
        name="reporter_parent", instructions="x", tools=[agent_tool(child, "Report.")],
        model=ScriptedModel([call("reporter_child", message="go"), say("parent done")]),
    )  # fmt: skip
    with Threads.embedded() as threads:
        run = threads.wait(threads.start(parent, "go", env={"PRIVATE_KEY": secret}).run_id, 30)
        assert run.status == "completed", run.error
        [row] = threads.agent_tool_runs(run.thread_id)
        snapshot = threads.inspect_agent_tool_run(row.run_id)
        assert snapshot is not None and snapshot.child_thread_id is not None
        events = [json.dumps(e.payload) for t in (run.thread_id, snapshot.child_thread_id) for e in threads.events(t)]
        dump: list[str] = []
        with threads.store.read() as tx:
            for table in schema.metadata.sorted_tables:
                dump.extend(str(tuple(r)) for r in tx.conn.execute(select(table)))
    assert [m.name for m in snapshot.milestones] == ["keyed"]
    assert snapshot.milestones[0].data == {"key": REDACTED, "lines": [REDACTED, REDACTED, REDACTED, REDACTED]}
    text = json.dumps(snapshot.progress) + "\n".join(events) + "\n".join(dump)
    assert "using ***" in text
    assert not leaks(text, secret) and json.dumps(secret)[1:-1] not in text


def test_an_exception_escaping_the_call_is_scrubbed_before_anyone_logs_it() -> None:
    from threads_celery.redaction import secrets_active

    revealed: list[str] = []
    with pytest.raises(SystemExit) as caught, secrets_active(revealed):
        revealed.append(PEM)
        try:
            raise KeyError(PEM)
        except KeyError as inner:
            raise SystemExit(f"giving up on {PEM!r}") from inner
    chain = f"{caught.value} {caught.value.__cause__}"
    assert "giving up on" in chain and REDACTED in chain
    assert not leaks(chain, PEM) and repr(PEM)[1:-1] not in chain


def test_a_validation_error_is_described_without_its_input_values() -> None:
    # pydantic shortens a long input to 'sk-live-abcdef...wxyz': exact-match redaction misses it.
    class Payment(BaseModel):
        amount: int

    secret = "sk-live-" + "abcdefghijklmnopqrstuvwxyz0123456789" * 3
    with pytest.raises(ValueError) as caught:
        Payment.model_validate({"amount": secret})
    text = describe_exception(caught.value, [secret])
    assert text.startswith("ValidationError: 1 validation error for Payment") and "amount" in text, text
    assert "sk-live" not in text and "wxyz" not in text and "input_value" not in text, text


class _HostileStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _OddArgs(Exception):
    def __init__(self, needed: object) -> None:
        super().__init__()
        self.needed = needed

    def __str__(self) -> str:
        return f"needed {self.needed.missing}"  # type: ignore[attr-defined]


class _NeedsArgument(BaseException):
    def __init__(self, needed: object) -> None:
        super().__init__(needed)


class _ExitingStr(Exception):
    def __str__(self) -> str:
        raise _NeedsArgument(1)


class _NamelessMeta(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name")


class _Nameless(Exception, metaclass=_NamelessMeta):
    pass


def test_describing_an_exception_never_raises() -> None:
    cases: list[BaseException] = [_HostileStr("sk-secret-value"), _OddArgs(object()), _HostileStr(), _ExitingStr()]
    for exc in cases:
        text = describe_exception(exc, ["sk-secret-value"])
        assert text.startswith(type(exc).__name__ + ": ") and "\n" not in text and "sk-secret" not in text, text
    assert describe_exception(_Nameless("sk-secret-value"), ["sk-secret-value"]) == "Exception: ***"


ENCODED_HOSTILE = ["sk-\"dq\"-'sq'-&amp-<lt>-\\bs-é€-canary", "plain-sk-live-0123456789abcdef"]


@pytest.mark.parametrize("secret", ENCODED_HOSTILE)
def test_html_xml_csv_shell_yaml_and_triple_json_forms_are_redacted(secret: str) -> None:
    import csv
    import html
    import io
    import shlex

    import yaml

    buffer = io.StringIO()
    csv.writer(buffer, quoting=csv.QUOTE_ALL).writerow([secret])
    renderings = [
        html.escape(secret),
        html.escape(secret, quote=False),
        "".join(f"&#{ord(c)};" for c in secret),
        "".join(f"&#x{ord(c):x};" for c in secret),
        buffer.getvalue(),
        shlex.quote(secret),
        "".join("\\" + c if not c.isalnum() else c for c in secret),
        yaml.safe_dump({"k": secret}, default_style="'", allow_unicode=True),
        json.dumps({"a": json.dumps({"b": json.dumps({"c": secret})})}),
    ]
    for text in renderings:
        clean = redact_text(f"before {text} after", [secret])
        assert REDACTED in clean and "canary" not in clean and "0123456789abcdef" not in clean, (text, clean)
