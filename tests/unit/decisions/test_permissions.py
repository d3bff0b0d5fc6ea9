"""Permission decisions: rule order, modes, and approvals bound to arguments."""

import pytest

from threads_celery.decisions.permissions import Allow, Ask, Deny, Permissions, decide_permission, may_be_remembered
from threads_celery.exceptions import ConfigError

EFFECTS = ("read_only", "idempotent", "reconcilable", "unguarded")


@pytest.mark.parametrize("effect", EFFECTS)
def test_default_mode_runs_read_only_freely_and_asks_for_everything_else(effect: str) -> None:
    decision = decide_permission("t", effect, Permissions())
    assert isinstance(decision, Allow if effect == "read_only" else Ask)


def test_no_permissions_means_default_mode() -> None:
    assert isinstance(decide_permission("t", "unguarded", None), Ask)
    assert isinstance(decide_permission("t", "read_only", None), Allow)


def test_deny_rule_wins_over_ask_and_allow_rules_and_over_an_approval() -> None:
    rules = Permissions(allow=["t"], ask=["t"], deny=["t"])
    assert isinstance(decide_permission("t", "read_only", rules, approved_for_these_args=True), Deny)


def test_ask_rule_wins_over_allow_rule_and_over_read_only() -> None:
    rules = Permissions(allow=["t"], ask=["t"])
    assert isinstance(decide_permission("t", "read_only", rules), Ask)


def test_allow_list_runs_a_named_tool_without_asking() -> None:
    rules = Permissions(allow=["send_email"])
    assert isinstance(decide_permission("send_email", "unguarded", rules), Allow)
    assert isinstance(decide_permission("charge_card", "unguarded", rules), Ask)


def test_an_approval_for_these_arguments_answers_the_ask() -> None:
    assert isinstance(decide_permission("t", "unguarded", Permissions(), approved_for_these_args=True), Allow)
    assert isinstance(decide_permission("t", "unguarded", Permissions(), approved_for_these_args=False), Ask)


def test_dont_ask_denies_what_would_ask() -> None:
    rules = Permissions("dont_ask")
    assert isinstance(decide_permission("t", "idempotent", rules), Deny)
    assert isinstance(decide_permission("t", "read_only", rules), Allow)


def test_bypass_must_be_enabled_explicitly() -> None:
    with pytest.raises(ConfigError, match="enabled explicitly"):
        Permissions("bypass")
    rules = Permissions("bypass", enable_bypass=True)
    assert isinstance(decide_permission("t", "unguarded", rules), Allow)
    assert Permissions.allow_all() == rules


def test_bad_mode_and_string_rules_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="permission mode"):
        Permissions("yolo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lists of tool names"):
        Permissions(allow="send_email")


@pytest.mark.parametrize("effect", ["idempotent", "reconcilable"])
def test_accept_edits_asks_first_for_a_destructive_edit(effect: str) -> None:
    rules = Permissions("accept_edits")
    assert isinstance(decide_permission("reset", effect, rules), Allow)
    asked = decide_permission("reset", effect, rules, destructive=True)
    assert isinstance(asked, Ask) and "destructive" in asked.reason
    # A rule, a person's remembered decision or an approval of these arguments still settles it.
    assert isinstance(
        decide_permission("reset", effect, Permissions("accept_edits", allow=["reset"]), destructive=True), Allow
    )
    assert isinstance(decide_permission("reset", effect, rules, destructive=True, remembered=True), Allow)
    assert isinstance(decide_permission("reset", effect, rules, destructive=True, approved_for_these_args=True), Allow)
    assert may_be_remembered("reset", effect, rules, destructive=True)
    assert not may_be_remembered("reset", effect, rules)


def test_destructive_changes_nothing_outside_accept_edits() -> None:
    for mode, effect in [("default", "idempotent"), ("plan", "idempotent"), ("dont_ask", "unguarded")]:
        rules = Permissions(mode)  # type: ignore[arg-type]
        plain, destructive = (decide_permission("t", effect, rules, destructive=d) for d in (False, True))
        assert type(plain) is type(destructive), mode
    bypass = Permissions.allow_all()
    assert isinstance(decide_permission("t", "unguarded", bypass, destructive=True), Allow)
