"""A Pydantic AI agent's structured output, offered to the model as Pydantic AI offers it.

Part of :func:`~threads_celery.definitions.pydantic_ai_adapter.from_pydantic_ai`. The output tools
are the ones the Pydantic AI agent's own output schema builds, so their names, descriptions and
JSON schemas are Pydantic AI's by construction, and each call is checked by the processor Pydantic
AI would check it with.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.tools import ToolDefinition

from threads_celery.definitions.schema_tools import SchemaTool, ToolArguments, schema_tool
from threads_celery.definitions.tools import ToolArgumentsError, ToolOutputError, describe_validation_error
from threads_celery.exceptions import ConfigError

OUTPUT_TOOL_DESCRIPTION = "The final response which ends this conversation"
#: Pydantic AI's end strategies, each honoured (see :meth:`OutputTools.order_calls`).
END_STRATEGIES = ("early", "graceful", "exhaustive")
#: What the model is shown for a valid output that is not the run's output because a function call
#: of the same reply was asked to retry (Pydantic AI's words).
RETRY_WINS = "Output not used as the final result - addressing tool retries from this round first."
#: What the model is shown, in a later run of the thread, for the output call that ended a run.
FINAL_RESULT_PROCESSED = "Final result processed."


@dataclasses.dataclass(frozen=True)
class OutputTools:
    """A structured output type offered to the model exactly as Pydantic AI offers it: the output
    tools its own output schema builds (``final_result``, or ``final_result_<Name>`` per member of
    a union; the type's docstring as the description; its JSON schema as Pydantic AI shapes it),
    each checked by the processor Pydantic AI would check it with."""

    output_type: Any
    adapter: TypeAdapter[Any]  # the run's output, kept as JSON of the output type
    definitions: tuple[ToolDefinition, ...]
    processors: Mapping[str, Any]  # pydantic_ai's ObjectOutputProcessor, by tool name
    #: The agent's output validators (pydantic_ai's OutputValidator), run in order on a valid output.
    validators: tuple[Any, ...] = ()
    #: The RunContext a validator is given (the worker thread's dependencies), for a run step.
    context: Callable[[int | None], Any] | None = None
    #: The Pydantic AI agent's ``end_strategy``: what happens to the function tools the model
    #: calls beside an output tool (see :meth:`order_calls`).
    end_strategy: str = "graceful"

    @classmethod
    def of(cls, agent: Any, owner: str, context: Callable[[int | None], Any] | None = None) -> OutputTools | None:
        """The output tools of a Pydantic AI agent (None for text output); ConfigError for an
        output spec that cannot be durable."""
        from pydantic_ai import _output  # the agent's own output schema: the one source of parity

        schema = agent._output_schema
        if isinstance(schema, _output.TextOutputSchema) and schema.toolset is None:
            if type(schema.text_processor) is not _output.TextOutputProcessor:
                raise ConfigError(f"{owner}: a text output function does not carry over; return the text instead")
            return None
        if not isinstance(schema, (_output.AutoOutputSchema, _output.ToolOutputSchema)) or schema.toolset is None:
            raise ConfigError(
                f"{owner}: output_type={agent.output_type!r} ({type(schema).__name__.removesuffix('Schema')}) does not carry over "
                "(NativeOutput, PromptedOutput and text output are not durable yet); use an output type or ToolOutput"
            )
        # An auto schema's text processor is its object processor read from text, not plain text.
        mixed = isinstance(schema, _output.ToolOutputSchema) and schema.allows_text
        if mixed or schema.allows_deferred_tools or schema.allows_image:
            raise ConfigError(
                f"{owner}: output_type={agent.output_type!r} also allows text, images or deferred tools, "
                "which does not carry over; give output types only"
            )
        toolset = schema.toolset
        processors = dict(toolset.processors)
        for name, processor in processors.items():
            if getattr(processor, "_function_schema", None) is not None or getattr(processor, "_choice_values", None):
                raise ConfigError(f"{owner}: output tool {name!r} runs an output function, which does not carry over")
        kinds: list[Any] = list(_output.types_from_output_spec(agent.output_type))
        kept: Any = kinds[0] if len(kinds) == 1 else Union[tuple(kinds)]  # noqa: UP007 - built at run time
        try:  # ToolOutput(X, ...) and lists of specs: the types they stand for
            adapter: TypeAdapter[Any] = TypeAdapter(kept)
        except Exception as exc:  # noqa: BLE001 - pydantic refuses the type
            raise ConfigError(f"{owner}: output type {agent.output_type!r} cannot be kept as JSON: {exc}") from None
        validators = tuple(agent._output_validators)
        strategy = getattr(agent, "end_strategy", None) or "graceful"
        if strategy not in END_STRATEGIES:
            raise ConfigError(f"{owner}: end_strategy={strategy!r} is not one of {', '.join(END_STRATEGIES)}")
        return cls(agent.output_type, adapter, tuple(toolset._tool_defs), processors, validators, context, strategy)

    @property
    def fingerprint(self) -> list[Any]:
        """What a live thread is pinned to: each tool's name, description and schema."""
        return [[d.name, d.description, d.parameters_json_schema] for d in self.definitions] + [
            ["end_strategy", self.end_strategy]
        ]

    def validate_call(self, tool_name: str, args: Any) -> Any:
        """The output value for a call of output tool ``tool_name``; ValidationError or
        ValueError when the arguments do not make one."""
        processor = self.processors[tool_name]
        data = json.loads(args) if isinstance(args, str) else (args or {})
        value = processor.validator.validate_python(data)
        key = getattr(processor, "outer_typed_dict_key", None)
        if key is not None:
            value = value[key]
        return value

    async def finished(self, tool_name: str, args: Any, *, run_step: int | None = None) -> Any:
        """The run's output for a call of output tool ``tool_name``: the validated value, then each
        output validator's (given a RunContext of ``run_step``). Raises ValidationError or
        ValueError for arguments that make no value, and ``ModelRetry`` when a validator asks the
        model to try again."""
        value = self.validate_call(tool_name, args)
        for validator in self.validators:
            value = await validator.validate(value, self.context(run_step) if self.context is not None else None)
        return value

    def order_calls(self, kinds: Sequence[bool]) -> list[int]:
        """The order a reply's calls run in (indexes into ``kinds``, True for an output call), as
        the end strategy has them run in Pydantic AI, one call after the other: ``early`` runs the
        output calls first, and a successful one ends the run, so the function calls run only when
        every output failed; ``graceful`` and ``exhaustive`` run the function calls first, then the
        output calls, the first valid one ending the run (unless a function call was asked to retry)."""
        outputs = [i for i, is_output in enumerate(kinds) if is_output]
        others = [i for i, is_output in enumerate(kinds) if not is_output]
        return outputs + others if self.end_strategy == "early" else others + outputs

    def to_json(self, value: Any) -> str:
        return self.adapter.dump_json(value).decode()

    def parse_json(self, text: str) -> Any:
        return self.adapter.validate_json(text)

    def tools(self) -> list[SchemaTool]:
        """The output tools as the runtime sees them: reached only when the model's output failed
        validation or an output validator, so the model gets the reason and can try again (a
        validator's ``ModelRetry`` reaches it as a retried call, as in Pydantic AI)."""
        built = []
        for definition in self.definitions:
            name = definition.name

            def validate(values: dict[str, Any], name: str = name) -> dict[str, Any]:
                try:
                    self.validate_call(name, values)
                except (ValidationError, ValueError) as exc:
                    why = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
                    raise ToolArgumentsError(f"the final result is not valid: {why}") from None
                return values

            async def execute(arguments: ToolArguments, ctx: Any, name: str = name) -> str:
                value = await self.finished(name, arguments.values, run_step=getattr(ctx, "run_step", None))
                if self.end_strategy != "early":
                    retried = getattr(ctx, "retried_in_reply", None)
                    if callable(retried) and any(n not in self.processors for n in retried()):
                        # A function call of this reply was asked to retry: as in Pydantic AI, the
                        # model addresses that first, and this output is not the final result.
                        raise ToolOutputError(RETRY_WINS)
                return self.to_json(value)

            tool = schema_tool(
                name=name,
                description=definition.description or OUTPUT_TOOL_DESCRIPTION,
                json_schema=definition.parameters_json_schema,
                validate=validate,
                execute=execute,
                effect="read_only",
            )
            built.append(dataclasses.replace(tool, ends_turn=True))
        return built


__all__ = ["END_STRATEGIES", "FINAL_RESULT_PROCESSED", "OUTPUT_TOOL_DESCRIPTION", "RETRY_WINS", "OutputTools"]
