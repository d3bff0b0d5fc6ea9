"""THREADS_SECRET_KEY: a malformed value is refused whole and never repeated; keys rotate."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from threads_celery.definitions.variables import SecretBox, check_secret_key, parse_secret_keys
from threads_celery.exceptions import ConfigError, SecretUndecryptable

GOOD = Fernet.generate_key().decode()
OTHER = Fernet.generate_key().decode()


@pytest.mark.parametrize(
    "raw",
    [
        "not-a-key",
        GOOD[:-4],  # a real key cut short
        GOOD + "AAAA",
        "",
        " ",
        f"{GOOD},",
        f"{GOOD},broken-second-key",
        "é" * 44,
    ],
)
def test_a_malformed_key_is_refused_without_repeating_it(raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_secret_key({"THREADS_SECRET_KEY": raw})
    message = str(caught.value)
    assert "THREADS_SECRET_KEY" in message
    assert "\n" not in message
    for part in (p for p in raw.split(",") if len(p.strip()) >= 4):
        assert part.strip() not in message


def test_an_unset_key_passes_the_start_check() -> None:
    check_secret_key({})


def test_a_good_key_and_a_rotation_pass() -> None:
    check_secret_key({"THREADS_SECRET_KEY": GOOD})
    check_secret_key({"THREADS_SECRET_KEY": f"{GOOD}, {OTHER}"})


def test_a_rotation_seals_with_the_first_key_and_opens_with_any() -> None:
    old_token = SecretBox(OTHER).seal("sk-old")
    rotated = SecretBox(f"{GOOD},{OTHER}")
    assert rotated.open(old_token) == "sk-old"
    new_token = rotated.seal("sk-new")
    assert SecretBox(GOOD).open(new_token) == "sk-new"
    with pytest.raises(SecretUndecryptable):
        SecretBox(OTHER).open(new_token)
    assert parse_secret_keys(f"{GOOD},{OTHER}").decrypt(old_token.encode()) == b"sk-old"


def test_a_secret_sealed_with_another_key_names_the_variable_and_pickles() -> None:
    import pickle

    token = SecretBox(OTHER).seal("sk-live-1")
    with pytest.raises(SecretUndecryptable) as caught:
        SecretBox(GOOD).open(token, name="API_KEY")
    assert "'API_KEY'" in str(caught.value)
    assert "sk-live-1" not in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(again, SecretUndecryptable) and str(again) == str(caught.value)
