"""Beat's retention entry: there with a policy, on the control queue; absent without one."""

from __future__ import annotations

from datetime import timedelta

from threads_celery.decisions.backbone import CONTROL_TASKS, RETENTION_TASK, message_priority
from threads_celery.settings import Settings
from threads_celery.transitions.publishing import celery_config

REDIS = "redis://127.0.0.1:6379/0"


def test_a_policy_adds_the_sweep_to_beat_on_the_control_queue() -> None:
    settings = Settings.from_env(
        env={
            "THREADS_RETENTION": '{"rules": [{"status": "failed", "keep_days": 30}]}',
            "THREADS_RETENTION_INTERVAL_S": "600",
        }
    )
    entry = celery_config(settings, REDIS)["beat_schedule"]["threads-retention"]
    assert entry["task"] == RETENTION_TASK and entry["schedule"] == timedelta(seconds=600)
    assert entry["options"]["queue"] == "threads.control"
    assert RETENTION_TASK in CONTROL_TASKS
    assert celery_config(settings, REDIS)["task_routes"][RETENTION_TASK]["queue"] == "threads.control"
    assert message_priority(RETENTION_TASK, recovered=False, broker_url=REDIS) == 0


def test_without_a_policy_beat_has_no_sweep() -> None:
    assert "threads-retention" not in celery_config(Settings.from_env(env={}), REDIS)["beat_schedule"]
