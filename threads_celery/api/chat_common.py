"""What the chat protocols share: a run's events as the parts of one chat reply.

The Vercel AI SDK's UI message stream (:mod:`~threads_celery.api.chat_vercel`) and AG-UI
(:mod:`~threads_celery.api.chat_agui`) both show one agent run as an assistant reply made of
text, reasoning and tool-call parts. :class:`ReplyParts` turns the run's events, in thread
order, into protocol-neutral :data:`Part` items that each protocol encodes with its own event
models; the run's messages in the ledger stay the truth.

Also here: which run a chat request streams (:func:`start_or_attach`, :func:`active_run`),
where its events begin (:func:`first_event_seq`), the approvals a request answers
(:func:`answer_approvals`) and the poll that feeds a reply (:func:`reply_stream`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from threads_celery.api.bodies import ID_PATTERN, Shown
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller, owned_call
from threads_celery.exceptions import CallNotFound, CallStateError
from threads_celery.live import events as live
from threads_celery.records import Event, Run

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

log = logging.getLogger("threads_celery.api.chat")

#: A run in one of these has ended; its reply is whole.
ENDED = frozenset({"completed", "error", "aborted", "interrupted"})
#: A run in one of these waits for a person: the reply ends here and a later request goes on.
WAITS_FOR_A_PERSON = frozenset({"awaiting_approval", "awaiting_variable", "parked"})
EVENT_BATCH = 500
_ID = re.compile(ID_PATTERN)


def is_id(value: str) -> bool:
    """Whether a client's id (a chat, thread or message id) can name a thread or run (``ID_PATTERN``)."""
    return _ID.fullmatch(value) is not None


# -- the parts of a reply ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepStart:
    """A model step begins (the previous one, if any, is over)."""


@dataclass(frozen=True, slots=True)
class TextStart:
    id: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    id: str
    delta: str


@dataclass(frozen=True, slots=True)
class TextEnd:
    id: str


@dataclass(frozen=True, slots=True)
class ReasoningStart:
    id: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    id: str
    delta: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    id: str


@dataclass(frozen=True, slots=True)
class ToolStart:
    """The model began a tool call: its name is known, its arguments may follow in pieces."""

    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArgsDelta:
    call_id: str
    delta: str


@dataclass(frozen=True, slots=True)
class ToolInput:
    """A tool call's arguments are whole (``args`` is their JSON text, ``input`` parsed)."""

    call_id: str
    name: str
    args: str
    input: Any
    streamed_args: str = ""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    call_id: str
    name: str
    content: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class ToolDenied:
    """A person denied the call; the model was shown ``content`` (``denied: <reason>``)."""

    call_id: str
    name: str
    content: str


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A call waits for a person's approval. ``approval_id`` is its effect key as the caller sees it."""

    approval_id: str
    call_id: str
    name: str
    args: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """Something other than an approval waits for a person (a parked call, a variable, a child's call).

    It is answered through ``/v1`` (``/v1/calls/{effect_key}/resolve``, ``/approve``...).
    """

    effect_key: str
    status: str
    tool: str
    reason: str
    kind: str


@dataclass(frozen=True, slots=True)
class StepVoided:
    """What the model step streamed so far is void (its worker died or its model call failed).

    The committed message, or the step's next attempt, follows; text already shown stays shown
    in protocols that cannot take it back, so a page may drop the parts before this one.
    """

    step: int
    attempt: int


@dataclass(frozen=True, slots=True)
class RunEnd:
    """The reply is over: the run ended (``completed``, ``error``...) or waits for a person (``waiting``)."""

    status: str
    output: str | None = None
    error: str | None = None


Part = (
    StepStart
    | TextStart
    | TextDelta
    | TextEnd
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | ToolStart
    | ToolArgsDelta
    | ToolInput
    | ToolOutput
    | ToolDenied
    | ApprovalRequest
    | Waiting
    | StepVoided
    | RunEnd
)


def parsed_args(args: str) -> Any:
    """A call's arguments as JSON, or the raw text when the model sent something that is not JSON."""
    try:
        return json.loads(args) if args else {}
    except ValueError:
        return args


@dataclass
class ReplyParts:
    """One run's events in, the parts of its chat reply out.

    Feed it the thread's events in order (:meth:`committed`); events of other runs are skipped.
    Every part it opens it closes before :class:`RunEnd`, so a client never sees a dangling part.
    ``lookup`` reads what waits for a person when the run stops for one (``threads.pending``),
    and whether an erroring call was denied.
    """

    run_id: str
    shown: Shown
    pending: Callable[[str], list[Any]]
    resolution_of: Callable[[str], str | None]
    done: bool = False
    _step_open: bool = False
    _text: str | None = None  # id of the open text part
    _reasoning: str | None = None
    _tools_started: set[str] = field(default_factory=set)
    _tools_args: dict[str, str] = field(default_factory=dict)  # call id -> args streamed so far
    _effect_keys: dict[str, str] = field(default_factory=dict)  # call id -> effect key
    _counter: int = 0
    _streamed_text: str = ""  # the open text part's text so far
    _delivered: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (step, attempt, part) -> seq

    def fresh(self, step: int, attempt: int, part: int, seq: int) -> bool:
        """Whether a delta was not shown yet (deltas are replayed from a step's start)."""
        key = (step, attempt, part)
        if seq <= self._delivered.get(key, 0):
            return False
        self._delivered[key] = seq
        return True

    def void(self, step: int, attempt: int) -> list[Part]:
        """A step's attempt (and its earlier ones) streamed in vain: close its parts, say so."""
        out = self.close_text()
        self._streamed_text = ""
        self._tools_args.clear()
        return [*out, StepVoided(step, attempt)]

    def _id(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}_{self.shown(self.run_id)}_{self._counter}"

    def _open_step(self) -> list[Part]:
        if self._step_open:
            return []
        self._step_open = True
        return [StepStart()]

    def close_text(self) -> list[Part]:
        out: list[Part] = []
        if self._reasoning is not None:
            out.append(ReasoningEnd(self._reasoning))
            self._reasoning = None
        if self._text is not None:
            out.append(TextEnd(self._text))
            self._text = None
        return out

    def _step_done(self) -> None:
        """The step's message is committed: what comes next belongs to the next model step."""
        self._step_open = False

    # -- live pieces (the model's deltas, before the step commits) --------------------------------

    def text_delta(self, text: str) -> list[Part]:
        if not text:
            return []
        out = self._open_step()
        if self._reasoning is not None:
            out += [ReasoningEnd(self._reasoning)]
            self._reasoning = None
        if self._text is None:
            self._text = self._id("text")
            out.append(TextStart(self._text))
        self._streamed_text += text
        out.append(TextDelta(self._text, text))
        return out

    def reasoning_delta(self, text: str) -> list[Part]:
        if not text:
            return []
        out = self._open_step()
        if self._text is not None:
            out += [TextEnd(self._text)]
            self._text = None
        if self._reasoning is None:
            self._reasoning = self._id("reasoning")
            out.append(ReasoningStart(self._reasoning))
        out.append(ReasoningDelta(self._reasoning, text))
        return out

    def tool_args_delta(self, call_id: str, name: str, args: str) -> list[Part]:
        out = self._open_step() + self.close_text()
        if call_id not in self._tools_started:
            self._tools_started.add(call_id)
            out.append(ToolStart(call_id, name))
        if args:
            self._tools_args[call_id] = self._tools_args.get(call_id, "") + args
            out.append(ToolArgsDelta(call_id, args))
        return out

    # -- committed events --------------------------------------------------------------------------

    def committed(self, event: Event) -> list[Part]:
        if self.done or event.run_id != self.run_id:
            return []
        payload = event.payload
        if event.type == "tool_call_started":
            return self.tool_args_delta(str(payload.get("call_id")), str(payload.get("name")), "")
        if event.type == "message":
            return self._message(payload)
        if event.type == "run":
            return self._run_status(payload)
        return []

    def _message(self, payload: dict[str, Any]) -> list[Part]:
        role = payload.get("role")
        if role == "assistant":
            return self._assistant(payload)
        if role == "tool" and isinstance(payload.get("tool_result"), dict):
            result = payload["tool_result"]
            call_id, name = str(result.get("call_id")), str(result.get("name"))
            content = str(result.get("content", payload.get("text") or ""))
            key = self._effect_keys.get(call_id)
            if result.get("is_error") and key is not None and self.resolution_of(key) == "denied":
                return [ToolDenied(call_id, name, content)]
            return [ToolOutput(call_id, name, content, bool(result.get("is_error")))]
        return []

    def _assistant(self, payload: dict[str, Any]) -> list[Part]:
        out = self._open_step()
        text = str(payload.get("text") or "")
        # The committed message is the truth. When the step's text was streamed, send only what
        # the stream had not sent yet (in the open text part, or a new one when a tool call closed
        # it); a stream that does not lead to it (voided, or pieces lost) is closed and the
        # committed text is shown whole.
        streamed = self._streamed_text
        if streamed and text.startswith(streamed):
            rest, text = text[len(streamed) :], ""
            if rest and self._text is None:
                out += self.close_text()
                self._text = self._id("text")
                out.append(TextStart(self._text))
            if rest and self._text is not None:
                out.append(TextDelta(self._text, rest))
        out += self.close_text()
        if text:
            text_id = self._id("text")
            out += [TextStart(text_id), TextDelta(text_id, text), TextEnd(text_id)]
        for call in payload.get("tool_calls") or []:
            call_id, name, args = str(call.get("id")), str(call.get("name")), str(call.get("args") or "")
            if isinstance(call.get("effect_key"), str):
                self._effect_keys[call_id] = call["effect_key"]
            if call_id not in self._tools_started:
                self._tools_started.add(call_id)
                out.append(ToolStart(call_id, name))
            out.append(ToolInput(call_id, name, args, parsed_args(args), self._tools_args.pop(call_id, "")))
        self._streamed_text = ""
        self._step_done()
        return out

    def _run_status(self, payload: dict[str, Any]) -> list[Part]:
        status = str(payload.get("status"))
        if status in ENDED:
            self.done = True
            output = payload.get("output")
            error = payload.get("error")
            return [
                *self.close_text(),
                RunEnd(status, output=str(output) if output is not None else None, error=_error_text(error)),
            ]
        if status in WAITS_FOR_A_PERSON:
            self.done = True
            out: list[Part] = self.close_text()
            for call in self.pending(self.run_id):
                if call.kind == "call" and call.status == "awaiting_approval" and call.run_id == self.run_id:
                    call_id = next((c for c, k in self._effect_keys.items() if k == call.effect_key), call.effect_key)
                    out.append(ApprovalRequest(self.shown(call.effect_key), call_id, call.tool, call.args))
                else:
                    out.append(
                        Waiting(self.shown(call.effect_key), call.status, call.tool, self.shown(call.reason), call.kind)
                    )
            out.append(RunEnd("waiting"))
            return out
        return []


def _error_text(error: Any) -> str | None:
    if error is None:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or json.dumps(error))
    return str(error)


def reply_parts(threads: Threads, run_id: str, shown: Shown) -> ReplyParts:
    """A :class:`ReplyParts` for ``run_id`` reading what it needs from ``threads``."""

    def resolution_of(effect_key: str) -> str | None:
        with threads.store.read() as tx:
            found = tx.get_call_and_run(effect_key)
        return None if found is None else found[0].resolution

    parts = ReplyParts(run_id=run_id, shown=shown, pending=threads.pending, resolution_of=resolution_of)
    # A reply that goes on after an approval names calls it did not show: know their effect keys.
    with threads.store.read() as tx:
        run = tx.get_run(run_id)
    if run is not None:
        for message in threads.messages(run.thread_id):
            if message.run_id == run_id:
                parts._effect_keys.update({c.id: c.effect_key for c in message.tool_calls if c.effect_key})
    return parts


# -- which run a request streams -----------------------------------------------------------------


def first_event_seq(threads: Threads, thread_id: str, run_id: str) -> int:
    """The seq just before the run's first event in its thread's log (its replay starts after it)."""
    cursor = 0
    while True:
        with threads.store.read() as tx:
            batch = tx.list_events(thread_id, after=cursor)
        for event in batch:
            if event.run_id == run_id:
                return event.seq - 1
            cursor = event.seq
        if not batch:
            return cursor


def last_status_seq(threads: Threads, thread_id: str, run_id: str, status: str) -> int:
    """The seq of the run's last ``run`` event with ``status``; 0 if there is none."""
    found, cursor = 0, 0
    while True:
        with threads.store.read() as tx:
            batch = list(islice(tx.list_events(thread_id, after=cursor), EVENT_BATCH))
        for event in batch:
            if event.run_id == run_id and event.type == "run" and event.payload.get("status") == status:
                found = event.seq
            cursor = event.seq
        if not batch:
            return found


def latest_run(threads: Threads, thread_id: str) -> Run | None:
    """The thread's newest run, if it has one."""
    found = threads.runs(thread_id=thread_id, limit=1)
    return found[0] if found else None


def check_agent(threads: Threads, agent: str, run: Run | None) -> None:
    """404 for an agent the ledger does not know; 409 for a thread of another agent."""
    with threads.store.read() as tx:
        known = tx.agent_hash(agent) is not None
    if not known:
        raise ApiError(404, "unknown_agent", f"agent {agent!r} is not registered")
    if run is not None and run.agent != agent:
        raise ApiError(409, "conflict", f"thread {run.thread_id} belongs to agent {run.agent!r}, not {agent!r}")


@dataclass(frozen=True, slots=True)
class Answer:
    """One person's answer to an approval, as a protocol's request carries it."""

    approval_id: str
    approved: bool
    reason: str | None = None
    override_args: dict[str, Any] | None = None


def answer_approvals(threads: Threads, caller: Caller, thread_id: str, answers: list[Answer]) -> str | None:
    """Record each answer under the caller's principal; the run they answer (stored id), if any.

    An approval of another tenant or thread is 404, as on ``/v1``. An answer to a call that was
    decided already (the client sent its history again) is skipped: deciding is not repeated.
    """
    run_id: str | None = None
    for answer in answers:
        key = owned_call(threads, caller, answer.approval_id)
        with threads.store.read() as tx:
            found = tx.get_call_and_run(key)
        if found is None or found[1].thread_id != thread_id:
            raise CallNotFound(answer.approval_id)
        call, run = found
        run_id = run.id
        if call.status != "awaiting_approval":
            continue
        try:
            if answer.approved:
                threads.approve(key, principal=caller.principal, override_args=answer.override_args)
            else:
                threads.deny(key, answer.reason or "denied by the user", principal=caller.principal)
        except CallStateError:
            continue  # decided meanwhile by another request: that decision stands
    return run_id


# -- the feed of a reply ---------------------------------------------------------------------------


async def reply_stream(
    threads: Threads,
    thread_id: str,
    parts: ReplyParts,
    cursor: int,
    *,
    poll_interval_s: float,
    keepalive_s: float,
) -> AsyncIterator[list[Part] | None]:
    """The reply's parts from the thread's live events after ``cursor``; ``None`` for a keepalive.

    The committed events and the deltas of the step in progress come merged from
    ``threads.live_events``; the deltas are shown as they come and the committed message
    completes them. Ends after the reply's :class:`RunEnd`, which leaves the subscription.
    ``poll_interval_s`` is unused since the live subscription is nudged: kept for the signature.
    """
    del poll_interval_s
    feed = _Feed(threads, thread_id, parts, cursor)
    async with threads.live_events(thread_id, after=cursor, heartbeat_s=keepalive_s) as events:
        async for event in events:
            if isinstance(event, live.Heartbeat):
                yield None
                continue
            out = await feed.parts_of(event)
            if out:
                yield out
            if parts.done:
                return


def _step_of(effect_key: object) -> int | None:
    """The step of an effect key ``<run id>:<step>:<index>``; None for anything else."""
    parts = effect_key.rsplit(":", 2) if isinstance(effect_key, str) else []
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() and len(parts[1]) < 10 else None


@dataclass
class _Feed:
    """Live events in order for one reply: a step's first delta comes after what committed before it.

    Deltas travel faster than the store is read, so the next model step's first delta can arrive
    before the previous step's tool results are read, though they were committed before it began.
    At each new step's first delta the store is read up to date first; committed events already
    fed are then skipped when the subscription delivers them.
    """

    threads: Threads
    thread_id: str
    parts: ReplyParts
    cursor: int
    step: tuple[int, int] | None = None
    #: Steps whose message is committed (a late delta of theirs is dropped); None: every step.
    _done_steps: set[int] | None = field(default_factory=set)

    def _committed_up_to_date(self) -> list[Part]:
        out: list[Part] = []
        while not self.parts.done:
            with self.threads.store.read() as tx:
                batch = tx.list_events(self.thread_id, after=self.cursor)
            if not batch:
                break
            for event in batch:
                out += self._committed(event)
                if self.parts.done:
                    break
        return out

    def _committed(self, event: Event) -> list[Part]:
        if event.seq <= self.cursor:
            return []  # fed already, when a step's first delta brought the store up to date
        self.cursor = event.seq
        payload = event.payload
        if event.type == "message" and event.run_id == self.parts.run_id and payload.get("role") == "assistant":
            # The step's message: its deltas are over. Its calls' effect keys (<run>:<step>:<i>) name
            # the step; a message with no call ends the run, and every step with it.
            keys = [c.get("effect_key") for c in payload.get("tool_calls") or [] if isinstance(c, dict)]
            steps = {step for k in keys if (step := _step_of(k)) is not None}
            if not steps:
                self._done_steps = None
            elif self._done_steps is not None:
                self._done_steps |= steps
        return self.parts.committed(event)

    def _step_is_done(self, step: int) -> bool:
        return self._done_steps is None or step in self._done_steps

    async def parts_of(self, event: live.LiveEvent) -> list[Part]:
        parts = self.parts
        match event:
            case live.Committed(event=committed):
                return await run_in_threadpool(self._committed, committed)
            case live.TextDelta() | live.ThinkingDelta() | live.ToolCallDelta() if event.run_id == parts.run_id:
                out: list[Part] = []
                if (event.step, event.attempt) != self.step:
                    self.step = (event.step, event.attempt)
                    out = await run_in_threadpool(self._committed_up_to_date)
                    if parts.done:
                        return out
                if self._step_is_done(event.step):
                    return out  # a step whose message is committed: the message showed it whole
                if not parts.fresh(event.step, event.attempt, event.part, event.seq):
                    return out  # sent already (a replay after a resync or of the step in progress)
                if isinstance(event, live.TextDelta):
                    return out + parts.text_delta(event.text)
                if isinstance(event, live.ThinkingDelta):
                    return out + parts.reasoning_delta(event.text)
                return out + parts.tool_args_delta(event.call_id, event.name, event.args)
            case live.StepVoid() if event.run_id == parts.run_id:
                return parts.void(event.step, event.attempt)
        return []


__all__ = [
    "Answer",
    "ApprovalRequest",
    "Part",
    "ReplyParts",
    "RunEnd",
    "Waiting",
    "answer_approvals",
    "check_agent",
    "first_event_seq",
    "latest_run",
    "reply_parts",
    "reply_stream",
]
