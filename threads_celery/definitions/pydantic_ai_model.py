"""The model of an agent made durable from Pydantic AI: its model, as Pydantic AI would call it.

Part of :func:`~threads_celery.definitions.pydantic_ai_adapter.from_pydantic_ai`. Wraps the agent's
model with what Pydantic AI adds around each request: the agent's model settings, its instructions
on the request, each tool's ``prepare`` function, and its output tools, whose valid call becomes
the run's output.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from pydantic import ValidationError
from pydantic_ai import RunContext
from pydantic_ai.messages import (
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition

from threads_celery.definitions.model_strings import resolve_model
from threads_celery.definitions.pydantic_ai_outputs import FINAL_RESULT_PROCESSED, RETRY_WINS, OutputTools
from threads_celery.definitions.tools import RETURNED_JSON
from threads_celery.exceptions import AgentCodeFailed
from threads_celery.redaction import describe_exception, known_secrets


def returned_values(messages: list[Any]) -> list[Any]:
    """``messages`` with each tool result that stands for a value the tool returned (not a string)
    given as that value, as Pydantic AI gives it to a model; the parts are copied, not changed."""
    out: list[Any] = []
    for message in messages:
        if isinstance(message, ModelRequest) and any(
            isinstance(p, ToolReturnPart) and p.metadata == RETURNED_JSON for p in message.parts
        ):
            parts = [
                dataclasses.replace(p, content=_decoded(p.content), metadata=None)
                if isinstance(p, ToolReturnPart) and p.metadata == RETURNED_JSON
                else p
                for p in message.parts
            ]
            message = dataclasses.replace(message, parts=parts)
        out.append(message)
    return out


def _decoded(content: Any) -> Any:
    try:
        return json.loads(content) if isinstance(content, str) else content
    except ValueError:
        return content


class PromptText(Protocol):
    """Instructions evaluated on each request (the adapter's prompt parts)."""

    async def text_async(self) -> str: ...


class DurableModel(WrapperModel):
    """The agent's model with its model settings, and its output type offered as an output tool.

    The wrapped model is resolved on first use, so building the agent (in a web app, say) needs
    no provider credentials.
    """

    def __init__(
        self,
        model: Any,
        *,
        settings: dict[str, Any],
        output: OutputTools | None,
        instructions: PromptText | None = None,
        prepared: Mapping[str, Any] | None = None,
        context: Callable[[], Any] | None = None,
    ) -> None:
        Model.__init__(self)
        self._spec = model
        self._agent_settings = settings
        self._output = output
        self._instructions = instructions
        #: Tools with a ``prepare`` function (pydantic_ai Tool), by name: asked on each model turn.
        self._prepared = dict(prepared or {})
        self._context = context
        self._inner: Model | None = None
        self._lock = threading.Lock()

    # WrapperModel declares ``wrapped`` a field; here it is resolved lazily (a model string needs
    # credentials only when a request is made), so a read-only property stands in for it.
    @property
    def wrapped(self) -> Model:  # type: ignore[override]
        return self.inner

    def __repr__(self) -> str:
        # Never resolve the model to show it: a missing key must not turn a message into an error.
        return repr(self._spec) if isinstance(self._spec, str) else f"DurableModel({self._spec!r})"

    @property
    def unresolved_spec(self) -> str | None:
        """The model string not resolved yet (None once resolved, or for a model object)."""
        return self._spec if isinstance(self._spec, str) and self._inner is None else None

    @property
    def inner(self) -> Model:
        """The wrapped pydantic-ai model (resolved from a model string on first use)."""
        with self._lock:
            if self._inner is None:
                self._inner = resolve_model(self._spec)
            return self._inner

    @property
    def model_name(self) -> str:
        if isinstance(self._spec, str):
            return self._spec.partition(":")[2] or self._spec
        return str(self.inner.model_name)

    @property
    def system(self) -> str:
        if isinstance(self._spec, str):
            return self._spec.partition(":")[0]
        return str(self.inner.system)

    def _merged_settings(self, model_settings: ModelSettings | None) -> ModelSettings | None:
        merged: dict[str, Any] = {**self._agent_settings, **dict(model_settings or {})}
        # The agent's settings are the user's plain dict: its keys are pydantic-ai's to check.
        return ModelSettings(**merged) if merged else None  # type: ignore[typeddict-item]

    def _parameters(self, params: ModelRequestParameters) -> ModelRequestParameters:
        if self._output is None:
            return params
        names = self._output.processors
        return dataclasses.replace(
            params,
            function_tools=[t for t in params.function_tools if t.name not in names],
            output_tools=list(self._output.definitions),
            output_mode="tool",
            allow_text_output=False,
        )

    async def _finalise(self, response: ModelResponse) -> ModelResponse:
        """The reply as the runtime carries it out: its calls in the order the agent's end strategy
        runs them (see :meth:`OutputTools.order_calls`), each output call checked in its own
        durable call, where a valid one ends the run with the output, once its validators pass.

        With no output validators (no agent code to run), a reply whose valid output call ends the
        run at once, whatever the calls beside it (``early``) or with none beside it, becomes that
        output (the answer's text, the run's output) without a call."""
        if self._output is None:
            return response
        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        kinds = [c.tool_name in self._output.processors for c in calls]
        if not any(kinds):
            return response
        if not self._output.validators and (self._output.end_strategy == "early" or all(kinds)):
            for call in (c for c, is_output in zip(calls, kinds, strict=True) if is_output):
                try:
                    value = self._output.validate_call(call.tool_name, call.args)
                except (ValidationError, ValueError):
                    continue
                return dataclasses.replace(response, parts=[TextPart(content=self._output.to_json(value))])
        order = self._output.order_calls(kinds)
        if order == sorted(order):
            return response
        rest = [p for p in response.parts if not isinstance(p, ToolCallPart)]
        return dataclasses.replace(response, parts=[*rest, *(calls[i] for i in order)])

    def _outputs_as_shown(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """``messages`` with the output calls' results as Pydantic AI shows them: the one that
        ended a run (its result is the run's output) as "Final result processed.", and one set
        aside for a function call's retry as a result, not a failure."""
        if self._output is None:
            return messages
        names = self._output.processors
        out: list[ModelMessage] = []
        for message in messages:
            if isinstance(message, ModelRequest) and any(
                isinstance(p, ToolReturnPart) and p.tool_name in names for p in message.parts
            ):
                message = dataclasses.replace(message, parts=[self._output_shown(p) for p in message.parts])
            out.append(message)
        return out

    def _output_shown(self, part: Any) -> Any:
        if (
            not isinstance(part, ToolReturnPart)
            or self._output is None
            or part.tool_name not in self._output.processors
        ):
            return part
        if part.outcome == "success":
            return dataclasses.replace(part, content=FINAL_RESULT_PROCESSED, metadata=None)
        if part.outcome == "failed" and part.content == RETRY_WINS:
            return dataclasses.replace(part, outcome="success")
        return part

    def _streams(self) -> bool:
        inner = self.inner
        return not (isinstance(inner, FunctionModel) and inner.stream_function is None)

    async def _with_instructions(
        self, messages: list[ModelMessage], params: ModelRequestParameters
    ) -> tuple[list[ModelMessage], ModelRequestParameters]:
        """The agent's instructions on the request, as Pydantic AI sends them: on the last request
        and as the request's instruction parts."""
        if self._prepared:
            params = dataclasses.replace(params, function_tools=await self._prepare_tools(params.function_tools))
        messages = self._outputs_as_shown(returned_values(messages))  # tools' values as returned, not as JSON text
        text = await self._instructions.text_async() if self._instructions is not None else ""
        if not text:
            return messages, params
        if messages and isinstance(messages[-1], ModelRequest):
            messages = [*messages[:-1], dataclasses.replace(messages[-1], instructions=text)]
        return messages, dataclasses.replace(params, instruction_parts=[InstructionPart(content=text)])

    async def _prepare_tools(self, definitions: Sequence[ToolDefinition]) -> list[ToolDefinition]:
        """Each tool with a ``prepare`` function as that function shapes it for this turn (or left
        out when it returns None), as Pydantic AI asks it on every step."""
        prepared: list[ToolDefinition] = []
        for definition in definitions:
            pai_tool = self._prepared.get(definition.name)
            if pai_tool is None:
                prepared.append(definition)
                continue
            try:
                shaped = await pai_tool.prepare_tool_def(self._context() if self._context is not None else None)
            except Exception as exc:  # noqa: BLE001 - the agent's code: the run ends saying so
                raise AgentCodeFailed(
                    f"the prepare function of tool {definition.name!r} raised {describe_exception(exc, known_secrets())}"
                ) from None
            if shaped is not None:
                prepared.append(shaped)
        return prepared

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        messages, model_request_parameters = await self._with_instructions(messages, model_request_parameters)
        params = self._parameters(model_request_parameters)
        return await self._finalise(await self.inner.request(messages, self._merged_settings(model_settings), params))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        messages, model_request_parameters = await self._with_instructions(messages, model_request_parameters)
        params = self._parameters(model_request_parameters)
        settings = self._merged_settings(model_settings)
        if self._output is None and self._streams():
            async with self.inner.request_stream(messages, settings, params, run_context) as stream:
                yield stream
            return
        # Whether the output call is valid is only known once the answer is complete (and a
        # FunctionModel without a stream function answers whole): take the answer whole.
        response = await self._finalise(await self.inner.request(messages, settings, params))
        yield CompletedStreamedResponse(response, model_request_parameters=params, replay_events=True)


__all__ = ["DurableModel", "PromptText"]
