"""A missing provider package is named with the project's own extra, where it has one."""

from __future__ import annotations

import pytest

from threads_celery.runtime.preflight import our_extra

GOOGLE = (
    "Please install the `google-genai` package to use the Google provider, you can use the `google` "
    'optional group — `pip install "pydantic-ai-slim[google]"`'
)


@pytest.mark.parametrize("extra", ["openai", "anthropic", "google", "groq", "mistral", "bedrock"])
def test_a_provider_we_have_an_extra_for_is_installed_through_it(extra: str) -> None:
    message = our_extra(f'Please install `x`, `pip install "pydantic-ai-slim[{extra}]"`')
    assert message.endswith(f"`pip install 'threads-celery[{extra}]'`"), message
    assert "pydantic-ai-slim" not in message


def test_pydantic_ais_own_wording_is_rewritten_in_place() -> None:
    assert our_extra(GOOGLE).endswith("— `pip install 'threads-celery[google]'`")


def test_a_provider_we_have_no_extra_for_keeps_pydantic_ais_hint() -> None:
    message = 'Please install `cohere`, `pip install "pydantic-ai-slim[cohere]"`'
    assert our_extra(message) == message
    assert our_extra("No module named 'x'") == "No module named 'x'"
