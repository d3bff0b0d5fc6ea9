"""A Celery signature sent when a run ends: how a task of the project's waits for a run.

A task that starts a run and then blocks on ``threads.wait`` holds its worker slot for the whole
run (minutes, or days behind an approval). ``threads.start(..., on_finish=record_answer.s(42))``
instead ends the task at once; when the run ends, whatever way it ends (completed, error, aborted,
interrupted), the runtime sends ``record_answer`` with the run's outcome put first, as a Celery
``link`` does with a parent's result::

    {"run_id": "run_3f..", "thread_id": "thread_9a..", "agent": "support", "status": "completed"}

An immutable signature (``.si()``) is sent with its own arguments only. The outcome carries ids
and the status, never the run's text (task messages carry ids, so no answer or secret reaches
the broker, Flower or a result backend): the task reads the run with ``threads.get_run``.

The send is durable: the run's end writes the intent to the outbox in the same transaction, and a
``threads.deliver`` task sends the signature and only then consumes that row, so a worker lost
in between is covered by the reconcile backbone, which publishes the row again. It is sent at
least once: the Celery task id is ``finish:<run id>`` on every send, for a task that must act
once to check (``self.request.id``).

The signature is sent with the worker's own Celery app: with :func:`threads_celery.install` the
project's app, whose routes place it; a ``queue`` option set on the signature (``.set(queue=...)``)
wins. Only ``queue`` is kept among its options: the others (countdown, link, ...) are refused
when the run starts, since the runtime would not honour them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from threads_celery.decisions.backbone import check_queue_name
from threads_celery.records import OutboxEntry, Run

#: Where a run's ``input_meta`` keeps its finish signature (never copied to the message's meta).
META_KEY = "on_finish"

#: The most a finish signature may take, as JSON: it is stored on the run and sent as a message.
MAX_SIGNATURE_BYTES = 16 * 1024

#: The signature options the runtime honours; ``immutable`` is Celery's own for ``.si()``.
KEPT_OPTIONS = frozenset({"queue"})

#: The Celery task id of a run's finish callback, the same on every send (see the module docstring).
TASK_ID_PREFIX = "finish:"


def signature_spec(signature: object) -> dict[str, Any]:
    """What is stored of ``signature`` (a Celery ``Signature``, or the dict one serialises to):
    ``task``, ``args``, ``kwargs``, ``queue`` and ``immutable``; TypeError or ValueError, naming
    what is wrong, for anything that could not be sent as it says."""
    if not isinstance(signature, Mapping) or "task" not in signature:
        raise TypeError(
            f"on_finish takes a Celery signature (e.g. my_task.s(order_id)), not {type(signature).__name__}"
        )
    task = signature.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ValueError("on_finish: the signature names no task")
    args, kwargs = signature.get("args") or (), signature.get("kwargs") or {}
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
        raise TypeError("on_finish: the signature's args must be a list or tuple and its kwargs a mapping")
    options = dict(signature.get("options") or {})
    immutable = bool(signature.get("immutable") or options.pop("immutable", False))
    refused = sorted(set(options) - KEPT_OPTIONS)
    if refused:
        raise ValueError(
            f"on_finish: the signature's options {refused} are not honoured (only 'queue' is): "
            "set them on the task instead"
        )
    queue = options.get("queue")
    problem = check_queue_name("on_finish", queue)
    if problem is not None:
        raise ValueError(problem)
    if signature.get("subtask_type") or signature.get("chord_size"):
        raise ValueError("on_finish takes one task's signature, not a chain, group or chord")
    spec = {"task": task, "args": list(args), "kwargs": dict(kwargs), "queue": queue, "immutable": immutable}
    try:
        encoded = json.dumps(spec)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"on_finish: the signature's arguments must be JSON values: {exc}") from None
    if len(encoded.encode()) > MAX_SIGNATURE_BYTES:
        raise ValueError(f"on_finish: the signature takes over {MAX_SIGNATURE_BYTES} bytes as JSON; pass ids instead")
    return spec


def spec_of(run: Run) -> dict[str, Any] | None:
    """The finish signature ``run`` was started with, or None."""
    spec = (run.input_meta or {}).get(META_KEY)
    return spec if isinstance(spec, dict) else None


def outcome(run: Run, status: str) -> dict[str, str]:
    """What the callback receives first: the run's ids and how it ended."""
    return {"run_id": run.id, "thread_id": run.thread_id, "agent": run.agent, "status": status}


def callback_entry(run: Run, spec: Mapping[str, Any], status: str) -> OutboxEntry:
    """The message of ``spec`` for ``run`` ended ``status``: sent as it is, never stored."""
    args = tuple(spec.get("args") or ())
    if not spec.get("immutable"):
        args = (outcome(run, status), *args)
    return OutboxEntry(
        key=f"{TASK_ID_PREFIX}{run.id}",
        task=str(spec["task"]),
        args=args,
        queue=spec.get("queue"),
        argsrepr=f"(finish of {run.id} {status})",
        kwargs=dict(spec.get("kwargs") or {}),
        user_task=True,
    )


__all__ = ["META_KEY", "callback_entry", "outcome", "signature_spec", "spec_of"]
