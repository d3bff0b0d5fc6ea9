"""The model adapter: one streamed model turn through pydantic-ai's direct model layer.

Stored messages are turned into pydantic-ai messages here and nowhere else; the runtime sees only
:class:`ModelTurn` (text plus the calls the model asked for, with their raw argument JSON).
pydantic-ai is imported inside the functions that use it: it takes most of a second to load,
and Beat and the command line load the runtime without ever running a model turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from threads_celery.definitions.context import at_run_step
from threads_celery.definitions.model_strings import resolve_model
from threads_celery.definitions.tools import RETURNED_JSON, Tool, ToolContent
from threads_celery.records import Message

_loops = threading.local()


@dataclass(frozen=True, slots=True)
class RequestedCall:
    """A tool call as the model sent it: arguments are the raw JSON text."""

    call_id: str
    name: str
    args: str


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """The outcome of one model turn."""

    text: str
    calls: tuple[RequestedCall, ...] = ()
    model_name: str = ""
    usage: dict[str, int] = field(default_factory=dict)


#: The ledger keeps a call's name and id in columns of this many characters (on both stores).
MAX_CALL_NAME = 255


def bounded_turn(turn: ModelTurn) -> ModelTurn:
    """``turn`` with call names and ids cut to what the ledger holds.

    No tool has a name that long (:func:`threads_celery.definitions.tools.tool` allows 64 characters), so a
    cut name is still an unknown tool, which the model is told about like any other.
    """
    if all(len(c.name) <= MAX_CALL_NAME and len(c.call_id) <= MAX_CALL_NAME for c in turn.calls):
        return turn
    calls = tuple(
        RequestedCall(call_id=c.call_id[:MAX_CALL_NAME], name=c.name[:MAX_CALL_NAME], args=c.args) for c in turn.calls
    )
    return ModelTurn(text=turn.text, calls=calls, model_name=turn.model_name, usage=turn.usage)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """A piece of the model's stream, as it arrives.

    ``kind`` is ``text`` (``text`` holds the delta), ``thinking`` (the same, of a thinking part), ``call`` (a tool call appeared: ``index``,
    ``name``, ``call_id``) or ``args`` (``index`` and the ``text`` of an argument fragment).
    """

    kind: str
    index: int = 0
    text: str = ""
    name: str = ""
    call_id: str = ""


OnStream = Callable[[StreamEvent], None]


T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this thread's long-lived event loop.

    One loop per worker thread, kept for the thread's life, so HTTP clients that providers cache
    stay bound to a loop that still exists.
    """
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _loops.loop = loop
    return loop.run_until_complete(coro)


def cancel_pending() -> None:
    """Cancel what a :func:`run_coroutine` left on this thread's loop when an exception left it
    midway (see :mod:`.pauses`), and let it unwind: a coroutine interrupted that way must never
    go on later, inside the next one run here."""
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed() or loop.is_running():
        return
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        with contextlib.suppress(BaseException):  # what it raises unwinding is of no use now
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def to_model_messages(system_prompt: str, history: Sequence[Message]) -> list[Any]:
    """Stored messages as pydantic-ai request/response messages, in order."""
    return ModelHistory().messages(system_prompt, history)


class ModelHistory:
    """Stored messages converted to pydantic-ai messages, extended as the thread grows.

    A thread's history only grows, so the messages converted for one model step are converted
    again for none of the next: :meth:`messages` converts only the messages after those it saw.
    The converted requests and responses are shared between steps and never changed after they
    are closed (a request stays open until the next assistant message).
    """

    def __init__(self) -> None:
        self._closed: list[Any] = []
        self._pending: list[Any] = []
        self._seen = 0
        self._lock = threading.Lock()

    def messages(self, system_prompt: str, history: Sequence[Message]) -> list[Any]:
        """``history`` (which starts with every message seen before) for the model, in order."""
        from pydantic_ai.messages import ModelRequest, SystemPromptPart

        with self._lock:
            if len(history) < self._seen:  # not the history this conversion followed: start over
                self._closed, self._pending, self._seen = [], [], 0
            self._extend(history[self._seen :])
            self._seen = len(history)
            out = list(self._closed)
            if self._pending:
                out.append(ModelRequest(parts=list(self._pending)))
        if system_prompt:
            system = SystemPromptPart(content=system_prompt)
            if out and isinstance(out[0], ModelRequest):
                out[0] = ModelRequest(parts=[system, *out[0].parts])
            else:
                out.insert(0, ModelRequest(parts=[system]))
        return out

    def _extend(self, added: Sequence[Message]) -> None:
        from pydantic_ai.messages import (
            ModelRequest,
            ModelResponse,
            RetryInfo,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
            UserPromptPart,
        )

        for message in added:
            if message.role == "assistant":
                if self._pending:
                    self._closed.append(ModelRequest(parts=self._pending))
                    self._pending = []
                parts: list[Any] = []
                if message.text:
                    parts.append(TextPart(content=message.text))
                parts.extend(
                    ToolCallPart(tool_name=c.name, args=c.args or "{}", tool_call_id=c.id) for c in message.tool_calls
                )
                self._closed.append(ModelResponse(parts=parts or [TextPart(content="")]))
            elif message.role == "tool" and message.tool_result is not None:
                result = message.tool_result
                if result.kind in ("retry", "invalid"):  # the model is asked to call it again
                    self._pending.append(
                        ToolReturnPart(
                            tool_name=result.name,
                            content=result.content,
                            tool_call_id=result.call_id,
                            outcome="retried",
                            retry=RetryInfo(cause="model_retry" if result.kind == "retry" else "validation_error"),
                        )
                    )
                    continue
                self._pending.append(
                    ToolReturnPart(
                        tool_name=result.name,
                        content=_content(result.content) if result.kind == "content" else result.content,
                        tool_call_id=result.call_id,
                        outcome="failed" if result.is_error else "success",
                        # A value the tool returned, rendered as JSON: an agent that gives models
                        # the value itself, as Pydantic AI does, reads it back (see returned_values).
                        metadata=RETURNED_JSON if result.kind == "json" else None,
                    )
                )
            else:
                self._pending.append(UserPromptPart(content=message.text))


def _content(text: str) -> Any:
    """A stored result that holds files, as the parts it stands for (its text if it cannot be read)."""
    try:
        return ToolContent.parts(text)
    except ValueError:
        return text


def tool_definitions(tools: Sequence[Tool]) -> list[Any]:
    """pydantic-ai ToolDefinitions for our tools."""
    from pydantic_ai.tools import ToolDefinition

    return [ToolDefinition(name=t.name, description=t.description, parameters_json_schema=_schema_of(t)) for t in tools]


_schemas: dict[int, tuple[Tool, dict[str, Any]]] = {}


def _schema_of(tool: Tool) -> dict[str, Any]:
    """A tool's JSON schema, built once per tool object: pydantic builds it anew on every call
    (about 0.1 ms per tool and step here), and a tool does not change. pydantic-ai copies a
    schema before transforming it, so sharing it between steps is safe."""
    cached = _schemas.get(id(tool))
    if cached is not None and cached[0] is tool:
        return cached[1]
    schema = tool.parameters_json_schema()
    if len(_schemas) >= 4096:  # tools made on the fly: keep the memory bounded
        _schemas.clear()
    _schemas[id(tool)] = (tool, schema)
    return schema


def request_turn(
    model: Any,
    system_prompt: str,
    history: Sequence[Message],
    tools: Sequence[Tool],
    *,
    on_stream: OnStream | None = None,
    converted: ModelHistory | None = None,
    run_step: int = 0,
) -> ModelTurn:
    """Call the model once, streaming, and return what it said and which tools it called.

    ``converted`` carries the conversion of this thread's earlier messages over from the last
    step (see :class:`ModelHistory`). ``run_step`` is the request's number in its run (1 for the
    first), which an agent's code reads as Pydantic AI's ``RunContext.run_step``.
    """
    return run_coroutine(
        request_turn_async(
            model, system_prompt, history, tools, on_stream=on_stream, converted=converted, run_step=run_step
        )
    )


async def request_turn_async(
    model: Any,
    system_prompt: str,
    history: Sequence[Message],
    tools: Sequence[Tool],
    *,
    on_stream: OnStream | None = None,
    converted: ModelHistory | None = None,
    run_step: int = 0,
) -> ModelTurn:
    from pydantic_ai.models import ModelRequestParameters

    # The system prompt travels as a SystemPromptPart and no request carries ``instructions``:
    # saying "no instruction parts" outright spares pydantic-ai a scan of the whole history for
    # them on every request (the answer would be the same, at a cost growing with the thread).
    params = ModelRequestParameters(
        function_tools=tool_definitions(tools), allow_text_output=True, instruction_parts=[]
    )
    messages = (converted or ModelHistory()).messages(system_prompt, history)
    with at_run_step(run_step):
        return await _streamed_turn(model, messages, params, on_stream)


async def _streamed_turn(model: Any, messages: list[Any], params: Any, on_stream: OnStream | None) -> ModelTurn:
    from pydantic_ai.direct import model_request_stream
    from pydantic_ai.messages import (
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        ThinkingPart,
        ThinkingPartDelta,
        ToolCallPart,
        ToolCallPartDelta,
    )

    async with model_request_stream(resolve_model(model), messages, model_request_parameters=params) as stream:
        async for event in stream:
            if on_stream is None:
                continue
            if isinstance(event, PartStartEvent):
                part = event.part
                if isinstance(part, TextPart) and part.content:
                    on_stream(StreamEvent("text", event.index, text=part.content))
                elif isinstance(part, ThinkingPart) and part.content:
                    on_stream(StreamEvent("thinking", event.index, text=part.content))
                elif isinstance(part, ToolCallPart):
                    on_stream(StreamEvent("call", event.index, name=part.tool_name, call_id=part.tool_call_id))
                    if isinstance(part.args, str) and part.args:
                        on_stream(StreamEvent("args", event.index, text=part.args))
            elif isinstance(event, PartDeltaEvent):
                delta = event.delta
                if isinstance(delta, TextPartDelta) and delta.content_delta:
                    on_stream(StreamEvent("text", event.index, text=delta.content_delta))
                elif isinstance(delta, ThinkingPartDelta) and delta.content_delta:
                    on_stream(StreamEvent("thinking", event.index, text=delta.content_delta))
                elif isinstance(delta, ToolCallPartDelta) and isinstance(delta.args_delta, str):
                    on_stream(StreamEvent("args", event.index, text=delta.args_delta))
        response = stream.get()
    texts: list[str] = []
    calls: list[RequestedCall] = []
    for part in response.parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ToolCallPart):
            calls.append(RequestedCall(call_id=part.tool_call_id, name=part.tool_name, args=_args_text(part.args)))
    usage = response.usage
    return ModelTurn(
        text="".join(texts),
        calls=tuple(calls),
        model_name=response.model_name or "",
        usage={
            "input_tokens": int(getattr(usage, "input_tokens", 0) or 0),
            "output_tokens": int(getattr(usage, "output_tokens", 0) or 0),
        },
    )


def _args_text(args: Any) -> str:
    """The arguments as the model sent them: text stays text (even when it is not JSON)."""
    if args is None:
        return "{}"
    if isinstance(args, str):
        return args
    return json.dumps(args)
