"""What a monitor's task list says of a step or tool task that ended without doing its work.

A step or tool task that returns has, to Celery, succeeded: its ``task-succeeded`` event makes
Flower list it as SUCCESS, whatever it did. Many of those tasks did not run their call or step:
the call waits for a person's approval, for a variable, for a person's decision (parked), or for
the child run it started; the delivery found nothing left to do (a duplicate, a settled call, an
ended run); or the run's fence moved while it worked (another worker owns the run now) and its
result was refused. Listed as SUCCESS, a ``threads.tool send_email`` waiting for approval reads
as an email sent.

So the worker's main process, which sends a task's events, sends such a task's end as an event of
its own kind instead of ``task-succeeded``: ``task-awaiting_approval``, ``task-parked``, ... . Celery's
event state (which Flower, ``celery events`` and other monitors keep) takes the state of an event
type it does not know from its name, so Flower lists the task as ``AWAITING_APPROVAL``,
``PARKED``, ``WAITING``, ``SKIPPED``, ``VOIDED`` or ``GAVE_UP``, with the outcome as its result.
Nothing else changes: the message is acknowledged as before, and the event is sent only when
task events are on, as ``task-succeeded`` would have been.

What the task says it did is the outcome string it returns (what the worker's log shows);
:func:`outcome_state` reads it. The main process is handed that string's repr (Celery's
``resultrepr``), never the object.
"""

from __future__ import annotations

from typing import Any

from celery.worker.request import Request

#: Outcome prefixes, and the state a monitor lists the task in. The first that matches wins.
OUTCOME_STATES: tuple[tuple[str, str], ...] = (
    ("awaiting approval:", "AWAITING_APPROVAL"),  # the call waits for a person to approve it
    ("awaiting variables:", "AWAITING_VARIABLE"),  # ... for a person to set a variable it needs
    ("parked:", "PARKED"),  # a person must decide (a call cut off mid-effect, a usage limit)
    ("waiting on ", "WAITING"),  # the call started a child run and waits for its result
    ("skipped:", "SKIPPED"),  # nothing to do: a duplicate delivery, a settled call, an ended run
    ("fence lost", "VOIDED"),  # another worker owns the run now: this attempt's work was refused
    ("gave up:", "GAVE_UP"),  # failed too many times: the run ended in error
)

#: The Celery event that ends a task that returned.
SUCCEEDED_EVENT = "task-succeeded"


def outcome_state(result: object) -> str | None:
    """The state a task that returned ``result`` (its repr, as Celery's event carries it) is
    listed in, or None: SUCCESS, the step or call ran (or its result was recorded)."""
    if not isinstance(result, str):
        return None
    text = result[1:] if result[:1] in ("'", '"') else result
    for prefix, state in OUTCOME_STATES:
        if text.startswith(prefix):
            return state
    return None


def event_for(event_type: str, fields: dict[str, Any]) -> str:
    """The event to send in place of ``event_type`` with ``fields``: a task's own end for a
    ``task-succeeded`` whose result says it did not do its work, else ``event_type`` itself."""
    if event_type != SUCCEEDED_EVENT:
        return event_type
    state = outcome_state(fields.get("result"))
    return event_type if state is None else f"task-{state.lower()}"


class StatedRequest(Request):
    """A Request that sends the end of a task that did not do its work as an event of its own
    kind (see :func:`event_for`); every other event as Celery sends it."""

    def send_event(self, type: str, **fields: Any) -> None:
        super().send_event(event_for(type, fields), **fields)


def stated_request(base: type[Request]) -> type[Request]:
    """``base`` (a Request class of the step and tool tasks) with :class:`StatedRequest`'s events."""
    return type(f"Stated{base.__name__}", (StatedRequest, base), {})


__all__ = ["OUTCOME_STATES", "StatedRequest", "event_for", "outcome_state", "stated_request"]
