"""The retention policy: parsing, which rule applies, and what may never be touched."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from threads_celery.decisions.retention import (
    Keep,
    Prune,
    RetentionPolicy,
    refusal,
    retention_decision,
)
from threads_celery.exceptions import ConfigError

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Facts:
    thread_id: str = "t1"
    agent: str = "support"
    tenant: str = "default"
    last_status: str | None = "completed"
    last_activity: datetime = NOW - timedelta(days=10)
    unfinished_runs: tuple[str, ...] = ()
    open_risky_calls: tuple[str, ...] = ()
    held: bool = False


POLICY = RetentionPolicy.from_json(
    '{"rules": [{"status": "succeeded", "keep_days": 7}, {"status": "failed", "keep_days": 30},'
    ' {"tenant": "acme", "status": "succeeded", "keep_days": 365}, {"agent": "audit", "keep_days": null}],'
    ' "default_keep_days": 90}'
)


def test_succeeded_threads_go_after_seven_days_failed_ones_after_thirty() -> None:
    assert isinstance(retention_decision(Facts(), POLICY, NOW), Prune)
    for status in ("error", "aborted", "interrupted"):
        decided = retention_decision(Facts(last_status=status), POLICY, NOW)
        assert isinstance(decided, Keep) and "not due before" in decided.reason
        assert isinstance(retention_decision(Facts(last_status=status), POLICY, NOW + timedelta(days=21)), Prune)


def test_the_most_specific_rule_wins_and_a_null_keep_keeps_for_good() -> None:
    acme = Facts(tenant="acme")
    assert isinstance(retention_decision(acme, POLICY, NOW), Keep)
    assert isinstance(retention_decision(acme, POLICY, NOW + timedelta(days=356)), Prune)
    audit = retention_decision(Facts(agent="audit", last_status=None), POLICY, NOW + timedelta(days=9999))
    assert isinstance(audit, Keep) and "for good" in audit.reason


def test_a_thread_no_rule_names_takes_the_default_and_without_one_is_kept() -> None:
    no_runs = Facts(last_status=None, last_activity=NOW - timedelta(days=91))
    assert isinstance(retention_decision(no_runs, POLICY, NOW), Prune)
    bare = RetentionPolicy.from_json('{"rules": [{"status": "succeeded", "keep_days": 7}]}')
    assert isinstance(
        retention_decision(Facts(last_status="error", last_activity=NOW - timedelta(days=9999)), bare, NOW), Keep
    )
    assert not RetentionPolicy().enabled and RetentionPolicy.from_json("").shortest_keep is None
    assert POLICY.shortest_keep == timedelta(days=7)


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (Facts(unfinished_runs=("run_1",)), "is running: run run_1 has not finished"),
        (Facts(open_risky_calls=("run_1:0:0",)), "unguarded or reconcilable call without an outcome (run_1:0:0)"),
        (Facts(held=True), "is held"),
    ],
)
def test_running_threads_open_risky_calls_and_holds_are_never_pruned(facts: Facts, reason: str) -> None:
    decided = retention_decision(replace(facts, last_activity=NOW - timedelta(days=9999)), POLICY, NOW)
    assert isinstance(decided, Keep) and reason in decided.reason


def test_refusal_is_none_for_a_finished_thread_even_when_held() -> None:
    assert refusal(Facts()) is None and refusal(Facts(held=True)) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not JSON"),
        ("[]", "must be a JSON object"),
        ('{"rules": [{"status": "done", "keep_days": 1}]}', "is not one of"),
        ('{"rules": [{"status": "completed"}]}', "needs keep_days"),
        ('{"rules": [{"keep_days": -1}]}', "number of days"),
        ('{"rules": [{"keep_days": 1, "colour": "red"}]}', "unknown keys"),
        ('{"action": "archive"}', "needs an archive_url"),
        ('{"action": "shred"}', "'delete' or 'archive'"),
        ('{"batch_size": 0}', "batch_size"),
        ('{"keep": 1}', "unknown keys"),
    ],
)
def test_a_malformed_policy_is_a_config_error_naming_what_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetentionPolicy.from_json(raw)
