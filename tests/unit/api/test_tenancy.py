"""THREADS_API_TOKENS entries: bare tokens (one tenant, as before) and ``principal@tenant=token``."""

from __future__ import annotations

import pytest

from threads_celery.api.auth import callers_from_env, tokens_from_env
from threads_celery.api.tenancy import Caller, callers_from_tokens, parse_token_entry
from threads_celery.exceptions import ConfigError
from threads_celery.records import DEFAULT_TENANT


def test_a_bare_token_is_an_anonymous_principal_of_the_default_tenant() -> None:
    token, caller = parse_token_entry("  s3cret-token  ")
    assert token == "s3cret-token"
    assert caller.tenant == DEFAULT_TENANT and caller.principal.startswith("api:")
    assert "s3cret" not in caller.principal  # the principal is recorded; the token must not be
    assert parse_token_entry("other")[1].principal != caller.principal


def test_a_qualified_entry_names_principal_and_tenant() -> None:
    assert parse_token_entry("alice@acme=tok_a1") == ("tok_a1", Caller("alice", "acme"))
    assert parse_token_entry("ci-bot.v2@acme-eu=abc==") == (
        "abc==",
        Caller("ci-bot.v2", "acme-eu"),
    )  # padding stays in the token
    # Without "@tenant" an "=" is part of a bare token (base64 padding), not a separator.
    token, caller = parse_token_entry("abc==")
    assert token == "abc==" and caller.tenant == DEFAULT_TENANT


def test_the_environment_maps_tokens_to_callers() -> None:
    env = {"THREADS_API_TOKENS": "alice@acme=ta, bob@globex=tb ,legacy,"}
    callers = callers_from_env(env)
    assert callers["ta"] == Caller("alice", "acme") and callers["tb"] == Caller("bob", "globex")
    assert callers["legacy"].tenant == DEFAULT_TENANT
    assert tokens_from_env(env) == {"ta", "tb", "legacy"}
    assert callers_from_env({}) == {}


@pytest.mark.parametrize("entries", [["alice@acme=same", "bob@acme=same"], ["alice@acme= "]])
def test_ambiguous_or_empty_tokens_are_refused(entries: list[str]) -> None:
    with pytest.raises(ConfigError):
        callers_from_tokens(entries)


def test_a_mapping_is_taken_as_given() -> None:
    assert callers_from_tokens({"t": Caller("p", "x")}) == {"t": Caller("p", "x")}
