"""The compiled redactor (one pass for any number of secrets) and the secrets a process remembers.

:class:`Redactor` must find exactly what looking for every form in turn finds, however many
secrets it holds, and also a secret cut short next to an ellipsis. A secret revealed to a call
that has ended stays redacted from the process's logs (a thread the tool left behind may log
later), up to :data:`REMEMBER_AT_MOST` secrets, the least recently revealed forgotten first.
"""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threads_celery import redaction
from threads_celery.redaction import (
    REDACTED,
    install_log_redaction,
    known_secrets,
    redact_text,
    redactor_for,
    remember_secrets,
    rendered_forms,
    secrets_active,
)


def naive(text: str, secrets: list[str]) -> str:
    """Every form of every secret replaced in turn, the longest first: what the redactor must equal."""
    for form in sorted({f for s in secrets for f in rendered_forms(s)}, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    return text


@pytest.fixture(autouse=True)
def forget_remembered() -> Iterator[None]:
    saved = dict(redaction._remembered)
    redaction._remembered.clear()
    yield
    redaction._remembered.clear()
    redaction._remembered.update(saved)


def test_a_secret_cut_short_next_to_an_ellipsis_is_redacted() -> None:
    secret = "sk-live-" + "0123456789abcdef" * 3
    shown = [
        f"input_value='{secret[:25]}...{secret[-24:]}'",  # pydantic
        f"key {secret[:12]}…",  # rich
        f"'{secret[:30]}...'",  # reprlib
    ]
    for text in shown:
        redacted = redact_text(text, [secret])
        assert secret[:8] not in redacted and secret[-8:] not in redacted, redacted
    assert redact_text(shown[0], [secret]) == f"input_value='{REDACTED}...{REDACTED}'"
    # Without an ellipsis, a piece of a secret is just text: a prefix alone is not redacted.
    assert redact_text(f"prefix {secret[:12]} here", [secret]) == f"prefix {secret[:12]} here"


def test_hundreds_of_secrets_are_found_in_one_pass() -> None:
    rng = random.Random(7)
    secrets = ["sk-" + "".join(rng.choices(string.ascii_letters + string.digits, k=40)) for _ in range(300)]
    text = " | ".join(f"{i}: {s!r} and {s}" for i, s in enumerate(secrets[::7]))
    redacted = redact_text(text, secrets)
    assert not any(s in redacted for s in secrets)
    assert redacted == naive(text, secrets)


def test_overlapping_and_repeated_secrets() -> None:
    assert redact_text("abcabcabc", ["abc"]) == REDACTED * 3
    assert redact_text("password1 password", ["password", "password1"]) == f"{REDACTED} {REDACTED}"
    assert redact_text("x", []) == "x" and redact_text("", ["abc"]) == ""


pieces = st.sampled_from([*"ab\"'\\\n é€-&<", "sk", "..."])
words = st.lists(pieces, max_size=10).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    secrets=st.lists(words.filter(bool), min_size=1, max_size=4),
    noise=st.lists(words, max_size=6),
    picks=st.lists(st.integers(min_value=0, max_value=50), max_size=6),
)
def test_no_secret_survives_redaction_whatever_surrounds_its_forms(
    secrets: list[str], noise: list[str], picks: list[int]
) -> None:
    forms = [f for s in secrets for f in rendered_forms(s)]
    text = "".join(n + (forms[p % len(forms)] if forms else "") for n, p in zip(noise, picks, strict=False))
    redacted = redact_text(text, secrets)
    assert [s for s in secrets if s in redacted] == []
    assert [s for s in secrets if s in naive(text, secrets)] == []  # the baseline holds it too


def test_spans_are_where_the_forms_are() -> None:
    redactor = redactor_for(frozenset({"hunter22"}))
    assert redactor is not None
    text = 'a hunter22 b "hunter22"'
    assert [text[s:e] for s, e in redactor.spans(text)] == ["hunter22", "hunter22"]
    assert redactor.longest >= len("hunter22")


def test_an_ended_calls_secrets_stay_redacted_from_the_log(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    revealed: list[str] = []
    with secrets_active(revealed):
        revealed.append("sk-late-thread-secret")
    assert "sk-late-thread-secret" in known_secrets()
    with caplog.at_level(logging.INFO):
        logging.getLogger("tool.leftover").info("later: %s", "sk-late-thread-secret")
    assert "later: ***" in caplog.text and "sk-late-thread-secret" not in caplog.text


def test_the_least_recently_revealed_secret_is_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "REMEMBER_AT_MOST", 3)
    remember_secrets(["one-secret", "two-secret", "three-secret"])
    remember_secrets(["one-secret"])  # revealed again: the most recent now
    remember_secrets(["four-secret"])
    assert set(known_secrets()) == {"three-secret", "one-secret", "four-secret"}


def test_known_secrets_are_the_running_calls_and_the_remembered_once_each() -> None:
    remember_secrets(["kept-secret"])
    revealed = ["running-secret", "kept-secret"]
    with secrets_active(revealed):
        assert sorted(known_secrets()) == ["kept-secret", "running-secret"]
    assert sorted(known_secrets()) == ["kept-secret", "running-secret"]
