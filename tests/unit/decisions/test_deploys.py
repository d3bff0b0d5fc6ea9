"""The deploy-version decisions: names, routing, placement, the versions' states and the
compatibility check of an upgrade, on plain values."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from threads_celery.decisions.backbone import control_queue_for
from threads_celery.decisions.deploys import (
    Compatible,
    Incompatible,
    NotYet,
    PendingCall,
    TargetAgent,
    TargetTool,
    UpgradeSubject,
    check_upgrade,
    check_version_name,
    choose_version,
    derive_version,
    ramp_bucket,
    retire_refusal,
    version_of_queue,
    version_statuses,
    versioned_queue,
)
from threads_celery.records import DeployVersion

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("name", ["v1", "2026.12.07-1", "build_42", "a+b"])
def test_a_version_name_is_accepted(name: str) -> None:
    assert check_version_name(name) is None


@pytest.mark.parametrize("name", ["", "v@1", "-v", "auto", "x.control", "a" * 65, 3, None, "v 1"])
def test_a_bad_version_name_is_refused_with_a_reason(name: object) -> None:
    reason = check_version_name(name)
    assert reason is not None and repr(name) in reason


def test_a_derived_version_follows_the_agents_config_hashes() -> None:
    one = derive_version({"a": "h1", "b": "h2"})
    assert one == derive_version({"b": "h2", "a": "h1"})
    assert one != derive_version({"a": "h1", "b": "h3"})
    assert one != derive_version({"a": "h1"})
    assert check_version_name(one) is None


def test_queues_are_versioned_only_with_a_version() -> None:
    assert versioned_queue(None, None) is None
    assert versioned_queue("email", None) == "email"
    assert versioned_queue(None, "v2") == "threads@v2"
    assert versioned_queue("email", "v2") == "email@v2"
    assert versioned_queue("email@v1", "v2") == "email@v2"
    assert version_of_queue("threads@v2") == "v2"
    assert version_of_queue("threads") is None and version_of_queue(None) is None


def test_every_version_shares_the_control_queue() -> None:
    assert control_queue_for("threads@v2") == "threads.control"
    assert control_queue_for("threads") == "threads.control"


def test_a_ramp_sends_its_share_of_new_runs_and_the_same_run_the_same_way() -> None:
    ids = [f"run_{i}" for i in range(2000)]
    ramped = [r for r in ids if choose_version(r, "v1", "v2", 25) == "v2"]
    assert 0.2 < len(ramped) / len(ids) < 0.3
    assert all(choose_version(r, "v1", "v2", 25) == "v2" for r in ramped)
    assert all(0 <= ramp_bucket(r) < 100 for r in ids)
    assert all(choose_version(r, "v1", "v2", 0) == "v1" for r in ids)
    assert all(choose_version(r, "v1", "v2", 100) == "v2" for r in ids)
    assert choose_version("run_x", None, None, 0) is None


def test_version_states_workers_runs_and_stranded() -> None:
    versions = [
        DeployVersion("v1", role=None, created_at=NOW - timedelta(days=2)),
        DeployVersion("v2", role="current", created_at=NOW - timedelta(days=1)),
        DeployVersion("v3", role="ramping", ramp_percent=10, created_at=NOW),
        DeployVersion("v0", role=None, created_at=NOW - timedelta(days=3)),
    ]
    workers = [
        ("w1", "v1", NOW - timedelta(seconds=90)),  # gone: not seen within the window
        ("w2", "v2", NOW - timedelta(seconds=5)),
        ("w3", "v3", NOW),
    ]
    unfinished = [("v1", "parked", 2), ("v1", "running", 1), ("v2", "running", 4), ("v9", "queued", 1)]
    by = {
        s.version: s for s in version_statuses(versions, workers, unfinished, now=NOW, liveness=timedelta(seconds=30))
    }
    assert by["v0"].state == "drained" and by["v0"].unfinished == 0
    assert by["v1"].state == "draining" and by["v1"].runs == {"parked": 2, "running": 1}
    assert by["v1"].workers == () and by["v1"].stranded == 3
    assert by["v2"].state == "active" and by["v2"].workers == ("w2",) and by["v2"].stranded == 0
    assert by["v3"].state == "active" and by["v3"].ramp_percent == 10
    # A version that only runs name (no worker ever registered it) is listed, and stranded.
    assert by["v9"].state == "draining" and by["v9"].stranded == 1


def test_retiring_is_refused_while_a_run_is_pinned_or_the_version_is_current() -> None:
    assert "current" in (retire_refusal("v2", "current", 0) or "")
    refused = retire_refusal("v1", None, 3)
    assert refused is not None and "3 unfinished" in refused and "--from v1" in refused
    assert retire_refusal("v1", None, 0) is None


# -- the compatibility check -------------------------------------------------------------------


def _args_fit(required: str):  # type: ignore[no-untyped-def]
    def check(raw: str) -> str | None:
        data = json.loads(raw or "{}")
        return None if required in data else f"{required}: field required"

    return check


def _output_is_int(raw: str) -> str | None:
    return None if isinstance(json.loads(raw), int) else "not an integer"


V2 = TargetAgent(
    name="planner",
    tools={
        "send_email": TargetTool("send_email", "unguarded", _args_fit("recipient")),
        "lookup": TargetTool("lookup", "read_only", _args_fit("q"), _output_is_int),
        "charge": TargetTool("charge", "idempotent", _args_fit("amount")),
    },
)
KNOWN = frozenset({"planner", "researcher"})


def _subject(*calls: PendingCall, children: tuple[str, ...] = (), lease: bool = False, status: str = "running"):  # type: ignore[no-untyped-def]
    return UpgradeSubject("run_1", "planner", status, "v1", lease, tuple(calls), children)


def test_nothing_pending_is_compatible() -> None:
    assert check_upgrade(_subject(), "v2", V2, KNOWN) == Compatible()


def test_a_pending_call_whose_tool_is_gone_stays_pinned_naming_it() -> None:
    decision = check_upgrade(
        _subject(PendingCall("run_1:0:0", "fax", "unguarded", "{}", "awaiting_approval")), "v2", V2, KNOWN
    )
    assert isinstance(decision, Incompatible)
    assert decision.reason == "call run_1:0:0: tool 'fax' does not exist in v2"


def test_a_renamed_argument_fails_the_recorded_arguments() -> None:
    call = PendingCall("run_1:0:0", "send_email", "unguarded", '{"to": "a@b"}', "awaiting_approval")
    decision = check_upgrade(_subject(call), "v2", V2, KNOWN)
    assert isinstance(decision, Incompatible)
    assert "recorded arguments fail 'send_email' in v2: recipient: field required" in decision.reason


def test_a_changed_effect_stays_pinned() -> None:
    call = PendingCall("run_1:0:0", "charge", "unguarded", '{"amount": 1}', "parked")
    decision = check_upgrade(_subject(call), "v2", V2, KNOWN)
    assert isinstance(decision, Incompatible)
    assert "is idempotent in v2, recorded unguarded" in decision.reason


def test_a_result_the_new_output_schema_refuses_stays_pinned() -> None:
    call = PendingCall("run_1:0:0", "lookup", "read_only", '{"q": "x"}', "completed", result='"seven"')
    decision = check_upgrade(_subject(call), "v2", V2, KNOWN)
    assert isinstance(decision, Incompatible) and "output schema in v2: not an integer" in decision.reason
    fine = PendingCall("run_1:0:0", "lookup", "read_only", '{"q": "x"}', "completed", result="7")
    assert check_upgrade(_subject(fine), "v2", V2, KNOWN) == Compatible()


def test_an_awaited_child_of_an_agent_gone_stays_pinned() -> None:
    decision = check_upgrade(_subject(children=("researcher", "summariser")), "v2", V2, KNOWN)
    assert isinstance(decision, Incompatible)
    assert decision.reasons == ("awaited child agent 'summariser' does not exist in v2",)


def test_the_agent_gone_stays_pinned() -> None:
    decision = check_upgrade(_subject(), "v2", None, KNOWN)
    assert isinstance(decision, Incompatible) and decision.reason == "agent 'planner' does not exist in v2"


def test_every_incompatibility_is_listed() -> None:
    decision = check_upgrade(
        _subject(
            PendingCall("k0", "fax", "unguarded", "{}", "pending"),
            PendingCall("k1", "send_email", "unguarded", "{}", "pending"),
            children=("gone",),
        ),
        "v2",
        V2,
        KNOWN,
    )
    assert isinstance(decision, Incompatible) and len(decision.reasons) == 3


@pytest.mark.parametrize("effect", ["unguarded", "reconcilable", "idempotent"])
def test_a_guarded_call_in_flight_waits_for_its_outcome(effect: str) -> None:
    tool = {"unguarded": "send_email", "reconcilable": "send_email", "idempotent": "charge"}[effect]
    decision = check_upgrade(_subject(PendingCall("k0", tool, effect, "{}", "started")), "v2", V2, KNOWN)
    assert isinstance(decision, NotYet) and "in flight" in decision.reason


def test_a_read_only_call_in_flight_does_not_hold_the_move() -> None:
    call = PendingCall("k0", "lookup", "read_only", '{"q": 1}', "started")
    assert check_upgrade(_subject(call), "v2", V2, KNOWN) == Compatible()


def test_a_step_in_flight_waits_for_the_boundary() -> None:
    assert isinstance(check_upgrade(_subject(lease=True), "v2", V2, KNOWN), NotYet)


def test_a_finished_run_or_one_already_there_does_not_move() -> None:
    assert isinstance(check_upgrade(_subject(status="completed"), "v2", V2, KNOWN), Incompatible)
    assert isinstance(check_upgrade(_subject(), "v1", V2, KNOWN), Incompatible)
