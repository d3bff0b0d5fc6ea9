"""The HTTP API's request and response bodies, as Pydantic models.

Requests reject unknown keys (``extra="forbid"``) and strings that the ledger cannot hold (a NUL
character or an unpaired surrogate; see :mod:`threads_celery.store.storable`). Responses are the public shape of the frozen
records in :mod:`threads_celery.records`; internal fields (fences, lease owners) stay inside.
Each ``of`` takes ``shown``, what the caller sees of a stored id (see
:func:`threads_celery.api.tenancy.shown_to`): ids, and the texts the runtime builds naming them
(errors, reasons), are shown in the caller's own form; what a person, a model or a tool wrote is
shown as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from threads_celery.records import Event, Message, Run, RunStatus
from threads_celery.store.storable import unstorable_reason
from threads_celery.transitions.pending import PendingCall

#: Ids a client may choose for a thread or a run: short, printable, URL-safe. No ``~``: that
#: joins a tenant to its own ids in the ledger (threads_celery.api.tenancy).
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"
#: Effect keys are ``<run id>:<step>:<index>``; a little more room for ids of child runs.
EFFECT_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,254}$"
#: The largest message or event sequence number the ledger holds (a 32-bit column).
MAX_SEQ = 2**31 - 1


def as_stored(value: str) -> str:
    """``shown`` for an answer that shows stored ids as they are."""
    return value


Shown = Callable[[str], str]
#: Payload keys whose values are ids, or runtime-built texts naming ids, in an event.
_ID_KEYS = frozenset(
    {"thread_id", "run_id", "effect_key", "via", "parent_thread_id", "parent_run_id", "child_thread_id",
     "child_run_id", "agent_tool_run_id", "parent_effect_key", "reason", "error"}
)  # fmt: skip


def _shown_payload(value: Any, shown: Shown, key: str | None = None) -> Any:
    if isinstance(value, str):
        return shown(value) if key in _ID_KEYS else value
    if isinstance(value, dict):
        return {k: _shown_payload(v, shown, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown_payload(v, shown) for v in value]
    return value


def _no_nul(value: str) -> str:
    reason = unstorable_reason(value)
    if reason is not None:
        raise ValueError(reason)
    return value


def _optional_no_nul(value: str | None) -> str | None:
    return None if value is None else _no_nul(value)


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity (Python's parser accepts them); refuse them at the edge."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be valid JSON: NaN and Infinity are not numbers in JSON")
    if isinstance(value, dict):
        for item in value.values():
            _finite(item)
    elif isinstance(value, list):
        for item in value:
            _finite(item)
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
Principal = Annotated[
    str,
    Field(min_length=1, max_length=255, description="Who decides, e.g. an e-mail address; recorded in the ledger."),
    AfterValidator(_no_nul),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class StartRun(_Request):
    """Start a run of ``agent`` on ``message``: on a new thread, or on ``thread_id``."""

    agent: Annotated[
        str, Field(min_length=1, max_length=128, description="A registered agent's name."), AfterValidator(_no_nul)
    ]
    message: Annotated[Text, Field(description="The user message.")]
    thread_id: Annotated[
        str | None, Field(pattern=ID_PATTERN, description="Continue this thread (or start one with this id).")
    ] = None
    run_id: Annotated[
        str | None,
        Field(pattern=ID_PATTERN, description="Idempotency: a run with this id that exists is returned as it is."),
    ] = None


class Approve(_Request):
    """Approve a call that awaits approval, for its exact arguments or for edited ones."""

    principal: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=255,
            description="Ignored: the approval is recorded under the bearer token's principal.",
        ),
        AfterValidator(_optional_no_nul),
    ] = None
    override_args: Annotated[
        dict[str, JsonValue] | None,
        Field(description="Edited arguments; validated against the tool's input schema, and recorded."),
        AfterValidator(_finite),
    ] = None
    remember: bool = Field(
        default=False,
        description='Also "always allow this tool on this thread" (the call\'s thread): a durable decision.',
    )


class Deny(_Request):
    """Deny a call that awaits approval; the model sees ``denied: <reason>``."""

    reason: Annotated[Text, Field(min_length=1, max_length=2000)]
    principal: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=255,
            description="Ignored: the denial is recorded under the bearer token's principal.",
        ),
        AfterValidator(_optional_no_nul),
    ] = None


class Resolve(_Request):
    """Settle a parked call: ``assume_done`` records ``result``; ``assume_not_done`` runs it again."""

    resolution: Literal["assume_done", "assume_not_done"]
    principal: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=255,
            description="Ignored: the resolution is recorded under the bearer token's principal.",
        ),
        AfterValidator(_optional_no_nul),
    ] = None
    result: Annotated[
        JsonValue, Field(description="With assume_done: the result the model is shown."), AfterValidator(_finite)
    ] = None


# -- responses ---------------------------------------------------------------------------------


class RunStarted(BaseModel):
    run_id: str
    thread_id: str
    status: RunStatus


class RunOut(BaseModel):
    id: str
    thread_id: str
    agent: str
    status: RunStatus
    step: int
    input: str
    output: str | None = None
    error: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def of(cls, run: Run, shown: Shown = as_stored) -> RunOut:
        return cls(
            id=shown(run.id),
            thread_id=shown(run.thread_id),
            agent=run.agent,
            status=run.status,
            step=run.step,
            input=run.input,
            output=run.output,
            error=shown(run.error) if run.error is not None else None,
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
        )


class ToolCallOut(BaseModel):
    id: str
    name: str
    args: str = Field(description="The raw JSON text the model sent.")
    effect_key: str


class ToolResultOut(BaseModel):
    call_id: str
    name: str
    content: str
    is_error: bool


class MessageOut(BaseModel):
    thread_id: str
    seq: int
    role: Literal["user", "assistant", "tool"]
    text: str
    run_id: str | None = None
    tool_calls: list[ToolCallOut] = []
    tool_result: ToolResultOut | None = None
    created_at: datetime | None = None
    #: The branch that left this message behind (only with ``include_superseded``).
    superseded_by: int | None = None

    @classmethod
    def of(cls, message: Message, shown: Shown = as_stored) -> MessageOut:
        result = message.tool_result
        return cls(
            thread_id=shown(message.thread_id),
            seq=message.seq,
            role=message.role,
            text=message.text,
            run_id=shown(message.run_id) if message.run_id is not None else None,
            tool_calls=[ToolCallOut(**_shown_payload(c.to_json(), shown)) for c in message.tool_calls],
            tool_result=ToolResultOut(**result.to_json()) if result is not None else None,
            created_at=message.created_at,
            superseded_by=message.superseded_by,
        )


class CallResultOut(BaseModel):
    """A tool call's whole result (the model may have been shown it shortened)."""

    effect_key: str
    status: str
    is_error: bool
    result: str | None = Field(description="The whole result; null while the call has none.")
    shortened_for_model: bool = Field(description="Whether the model was shown a shortened result.")


class PendingCallOut(BaseModel):
    effect_key: str
    run_id: str
    thread_id: str
    tool: str
    args: str
    status: str = Field(description="parked or awaiting_approval")
    reason: str
    attempt: int
    first_started_at: datetime | None = None
    kind: Literal["call", "child"] = Field(
        default="call", description="call: the run's own; child: a call of a child run it waits on"
    )
    agent: str | None = Field(default=None, description="For a child entry: the child's agent")
    via: str | None = Field(default=None, description="For a child entry: the agent-tool run it came through")

    @classmethod
    def of(cls, call: PendingCall, shown: Shown = as_stored) -> PendingCallOut:
        return cls(
            effect_key=shown(call.effect_key),
            run_id=shown(call.run_id),
            thread_id=shown(call.thread_id),
            tool=call.tool,
            args=call.args,
            status=call.status,
            reason=shown(call.reason),
            attempt=call.attempt,
            first_started_at=call.first_started_at,
            kind=call.kind,
            agent=call.agent,
            via=shown(call.via) if call.via is not None else None,
        )


class Decision(BaseModel):
    """What a person decided about a call; the run carries on in the workers."""

    effect_key: str
    decision: Literal["approved", "denied", "assume_done", "assume_not_done"]


class EventOut(BaseModel):
    """The ``data`` of one SSE frame (its ``id`` is ``seq`` and its ``event`` is ``type``)."""

    thread_id: str
    seq: int
    type: str
    run_id: str | None = None
    payload: dict[str, Any]
    created_at: datetime | None = None

    @classmethod
    def of(cls, event: Event, shown: Shown = as_stored) -> EventOut:
        return cls(
            thread_id=shown(event.thread_id),
            seq=event.seq,
            type=event.type,
            run_id=shown(event.run_id) if event.run_id is not None else None,
            payload=_shown_payload(event.payload, shown),
            created_at=event.created_at,
        )


class ErrorBody(BaseModel):
    type: str = Field(description="A stable, machine-readable error kind, e.g. run_not_found.")
    message: str
    details: list[dict[str, Any]] | None = Field(default=None, description="Validation errors: where and what.")


class ErrorOut(BaseModel):
    """Every error response has this shape."""

    error: ErrorBody


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, Literal["ok", "unavailable"]] = {}
    #: ``/readyz``: the workers that answered a ping (``in-process`` for the embedded worker).
    workers: list[str] | None = None


__all__ = [
    "EFFECT_KEY_PATTERN",
    "ID_PATTERN",
    "Approve",
    "Decision",
    "Deny",
    "ErrorOut",
    "EventOut",
    "Health",
    "MessageOut",
    "PendingCallOut",
    "Resolve",
    "RunOut",
    "RunStarted",
    "Shown",
    "StartRun",
    "as_stored",
]
