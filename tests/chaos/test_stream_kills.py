"""Chaos: the worker dies while the model streams. Subscribers see the partial turn voided, then
the retried turn's stream from its start, and the committed message holds the reply once.

The pool process running the step is SIGKILLed after a few deltas reached the subscriber (its pid
is the run's lease owner). Celery requeues the task (``acks_late`` + ``reject_on_worker_lost``);
the redelivery waits for the run's 2 s lease and claims the step again under a new fence: a new
attempt, whose deltas replace the dead one's.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from tests.chaos.chaos_agents import STREAMED_REPLY
from tests.support.waiting import eventually
from threads_celery.live import Committed, StepVoid, TextDelta

if TYPE_CHECKING:  # the conftest is pytest's to import; tests only name its types
    from tests.chaos.conftest import BeatProcess, ChaosCluster, WorkerProcess

SETTLE_S = 60.0


@pytest.fixture(scope="module")
def workers(cluster: ChaosCluster) -> list[WorkerProcess]:
    return cluster.start_workers(2)


@pytest.fixture(scope="module")
def beat(cluster: ChaosCluster) -> BeatProcess:
    return cluster.start_beat()


def test_a_worker_killed_mid_stream_voids_its_partial_turn_and_the_retry_streams_from_its_start(
    cluster: ChaosCluster, workers: list[WorkerProcess], beat: BeatProcess
) -> None:
    threads = cluster.threads
    handle = threads.start("chaos_streaming", "go")
    events: list[Any] = []
    failed: list[BaseException] = []

    def subscribe() -> None:
        try:
            events.extend(threads.stream(handle.run_id))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    reader = threading.Thread(target=subscribe, daemon=True)
    reader.start()
    eventually(
        lambda: sum(isinstance(e, TextDelta) for e in list(events)) >= 5,
        timeout=SETTLE_S,
        what="the first attempt's deltas reaching the subscriber",
        detail=lambda: (failed, cluster.get_run(handle.run_id).status),
    )
    run = cluster.get_run(handle.run_id)
    assert run.status == "running" and run.lease_owner
    pid = int(str(run.lease_owner).rsplit(":", 1)[1])
    cluster.worker_running(pid, workers).kill_child(pid)

    reader.join(SETTLE_S)
    assert not reader.is_alive() and not failed, failed
    assert cluster.get_run(handle.run_id).status == "completed"

    deltas = [e for e in events if isinstance(e, TextDelta)]
    attempts = sorted({d.attempt for d in deltas})
    assert len(attempts) >= 2, f"expected the step streamed by two attempts, got {attempts}"
    first, last = attempts[0], attempts[-1]
    voids = [e for e in events if isinstance(e, StepVoid)]
    assert voids and voids[0].attempt == first and voids[0].run_id == handle.run_id
    void_at = events.index(voids[0])
    # Everything the dead attempt streamed came before its void; the new attempt streams after
    # it, from seq 1, and its deltas make up the whole reply.
    assert all(events.index(d) < void_at for d in deltas if d.attempt == first)
    retried = [d for d in deltas if d.attempt == last]
    assert all(events.index(d) > void_at for d in retried)
    assert [d.seq for d in retried] == list(range(1, len(retried) + 1))
    assert "".join(d.text for d in retried) == STREAMED_REPLY
    [message] = [
        e for e in events if isinstance(e, Committed) and e.type == "message" and e.payload.get("role") == "assistant"
    ]
    assert message.payload["text"] == STREAMED_REPLY
    assistant = [m for m in threads.messages(run.thread_id) if m.role == "assistant"]
    assert [m.text for m in assistant] == [STREAMED_REPLY]
