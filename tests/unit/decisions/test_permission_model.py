"""The full permission model, exhaustively: every mode x effect x rule x remembered x approved,
against a table written out independently of the code; then the ceiling (the strictest of
several layers' answers) and when a remembered decision is worth loading. Pure: no store.
"""

from __future__ import annotations

import itertools

import pytest

from threads_celery.decisions.permissions import (
    Allow,
    Ask,
    Deny,
    Layer,
    Permissions,
    decide_permission,
    decide_with_ceiling,
    may_be_remembered,
    strictest,
)

EFFECTS = ("read_only", "idempotent", "reconcilable", "unguarded")
MODES = ("default", "accept_edits", "plan", "dont_ask", "bypass")
RULES = (None, "allow", "ask", "deny")

#: What each mode answers, by effect, when no rule and no remembered decision settles a call.
MODE_TABLE: dict[str, dict[str, type]] = {
    "default": {"read_only": Allow, "idempotent": Ask, "reconcilable": Ask, "unguarded": Ask},
    "accept_edits": {
        "read_only": Allow,
        "idempotent": Allow,
        "reconcilable": Allow,
        "unguarded": Ask,
    },
    "plan": {"read_only": Allow, "idempotent": Deny, "reconcilable": Deny, "unguarded": Deny},
    "dont_ask": {"read_only": Allow, "idempotent": Deny, "reconcilable": Deny, "unguarded": Deny},
    "bypass": {"read_only": Allow, "idempotent": Allow, "reconcilable": Allow, "unguarded": Allow},
}


def permissions(mode: str, rule: str | None) -> Permissions:
    lists = {rule: ["t"]} if rule else {}
    return Permissions(mode, enable_bypass=mode == "bypass", **lists)  # type: ignore[arg-type]


def expected(mode: str, effect: str, rule: str | None, remembered: bool, approved: bool) -> type:
    """The fixed order: deny rules, ask rules, allow rules, remembered decisions, the mode; an
    approval of these arguments answers an Ask and nothing else."""
    if rule == "deny":
        answer: type = Deny
    elif rule == "ask":
        answer = Ask
    elif rule == "allow" or remembered:
        answer = Allow
    else:
        answer = MODE_TABLE[mode][effect]
    return Allow if answer is Ask and approved else answer


CASES = list(itertools.product(MODES, EFFECTS, RULES, (False, True), (False, True)))


@pytest.mark.parametrize(("mode", "effect", "rule", "remembered", "approved"), CASES)
def test_every_combination_follows_the_fixed_order(
    mode: str, effect: str, rule: str | None, remembered: bool, approved: bool
) -> None:
    decision = decide_permission(
        "t",
        effect,
        permissions(mode, rule),
        remembered=remembered,
        approved_for_these_args=approved,
    )
    assert type(decision) is expected(mode, effect, rule, remembered, approved)
    assert decision.reason  # every answer says why


@pytest.mark.parametrize(("mode", "effect", "rule", "remembered", "approved"), CASES)
def test_one_layer_under_the_ceiling_is_the_plain_decision(
    mode: str, effect: str, rule: str | None, remembered: bool, approved: bool
) -> None:
    plain = decide_permission(
        "t",
        effect,
        permissions(mode, rule),
        remembered=remembered,
        approved_for_these_args=approved,
    )
    ceiling = decide_with_ceiling(
        "t",
        effect,
        [Layer(permissions(mode, rule), remembered=remembered)],
        approved_for_these_args=approved,
    )
    assert ceiling == plain


def test_rules_name_only_their_tool() -> None:
    rules = Permissions("plan", allow=["send_email"], deny=["read_secrets"])
    assert isinstance(decide_permission("send_email", "unguarded", rules), Allow)
    assert isinstance(decide_permission("charge_card", "unguarded", rules), Deny)
    assert isinstance(decide_permission("read_secrets", "read_only", rules), Deny)
    assert isinstance(decide_permission("read_docs", "read_only", rules), Allow)


def test_the_new_modes_say_why_in_words_the_model_can_use() -> None:
    assert "plan mode" in decide_permission("write_file", "idempotent", Permissions("plan")).reason
    assert "accept_edits" in decide_permission("send_email", "unguarded", Permissions("accept_edits")).reason


# -- strictest and the ceiling -----------------------------------------------------------------

ANSWERS = (Allow("a"), Ask("b"), Deny("c"))
RANK = {Allow: 0, Ask: 1, Deny: 2}


@pytest.mark.parametrize(("first", "second"), list(itertools.product(ANSWERS, ANSWERS)))
def test_the_stricter_of_two_answers_wins_and_the_first_of_equals(first: object, second: object) -> None:
    winner = strictest([first, second])  # type: ignore[list-item]
    if RANK[type(first)] >= RANK[type(second)]:
        assert winner is first
    else:
        assert winner is second


def test_strictest_needs_an_answer() -> None:
    with pytest.raises(ValueError, match="at least one"):
        strictest([])


LAYER_PERMISSIONS = {
    "default": Permissions(),
    "accept_edits": Permissions("accept_edits"),
    "plan": Permissions("plan"),
    "dont_ask": Permissions("dont_ask"),
    "bypass": Permissions.allow_all(),
    "allow_t": Permissions(allow=["t"]),
    "deny_t": Permissions(deny=["t"]),
    "ask_t": Permissions(ask=["t"]),
}


@pytest.mark.parametrize(
    ("child", "parent", "effect"),
    list(itertools.product(LAYER_PERMISSIONS, LAYER_PERMISSIONS, EFFECTS)),
)
def test_a_child_is_capped_by_its_parent(child: str, parent: str, effect: str) -> None:
    own = decide_permission("t", effect, LAYER_PERMISSIONS[child])
    cap = decide_permission("t", effect, LAYER_PERMISSIONS[parent])
    decision = decide_with_ceiling("t", effect, [Layer(LAYER_PERMISSIONS[child]), Layer(LAYER_PERMISSIONS[parent])])
    assert RANK[type(decision)] == max(RANK[type(own)], RANK[type(cap)])
    if RANK[type(cap)] > RANK[type(own)]:
        assert "a parent's permissions cap this child's" in decision.reason


def test_a_grandparent_caps_too() -> None:
    layers = [
        Layer(Permissions.allow_all()),
        Layer(Permissions.allow_all()),
        Layer(Permissions("plan")),
    ]
    assert isinstance(decide_with_ceiling("t", "unguarded", layers), Deny)


def test_an_approval_answers_the_ceilings_ask_but_never_lifts_a_deny() -> None:
    asked = [Layer(Permissions.allow_all()), Layer(Permissions())]
    assert isinstance(decide_with_ceiling("t", "unguarded", asked, approved_for_these_args=True), Allow)
    denied = [Layer(Permissions.allow_all()), Layer(Permissions("dont_ask"))]
    assert isinstance(decide_with_ceiling("t", "unguarded", denied, approved_for_these_args=True), Deny)


def test_a_remembered_decision_counts_at_the_level_it_is_given_for() -> None:
    layers = [Layer(Permissions(), remembered=True), Layer(Permissions(), remembered=True)]
    assert isinstance(decide_with_ceiling("t", "unguarded", layers), Allow)
    only_child = [Layer(Permissions(), remembered=True), Layer(Permissions())]
    assert isinstance(decide_with_ceiling("t", "unguarded", only_child), Ask)
    # A parent's rule still caps what a person remembered.
    ruled = [Layer(Permissions(), remembered=True), Layer(Permissions(ask=["t"]), remembered=True)]
    assert isinstance(decide_with_ceiling("t", "unguarded", ruled), Ask)


def test_no_layers_is_the_default_mode() -> None:
    assert isinstance(decide_with_ceiling("t", "unguarded", []), Ask)
    assert isinstance(decide_with_ceiling("t", "read_only", []), Allow)


# -- when a remembered decision is worth loading -------------------------------------------------


@pytest.mark.parametrize(("mode", "effect", "rule"), list(itertools.product(MODES, EFFECTS, RULES)))
def test_a_remembered_decision_is_loaded_only_when_it_could_change_the_answer(
    mode: str, effect: str, rule: str | None
) -> None:
    rules = permissions(mode, rule)
    could_change = type(decide_permission("t", effect, rules, remembered=True)) is not type(
        decide_permission("t", effect, rules)
    )
    assert may_be_remembered("t", effect, rules) == could_change
