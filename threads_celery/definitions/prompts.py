"""Prompts as tools: a nested prompt invocation in a child thread, its return shaped by flags.

A :class:`Prompt` is an agent definition used as a tool. ``as_tool(...)`` says what the caller
gets back (the final text, the tool calls made, the errors) and which input properties become
the child's first user message and its attachments.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from threads_celery.definitions.agent_tools import AgentToolInput, started_by_the_runtime
from threads_celery.definitions.agents import Agent
from threads_celery.definitions.tools import PromptToolOptions, Tool, tool
from threads_celery.exceptions import ConfigError
from threads_celery.records import Message


class Prompt(Agent):
    """An agent definition meant to be used as a tool (``Prompt(...).as_tool(...)``)."""

    def as_tool(
        self,
        *,
        description: str | None = None,
        input: type[BaseModel] = AgentToolInput,
        name: str | None = None,
        include_text_response: bool = True,
        include_tool_calls: bool = False,
        include_errors: bool = True,
        init_user_message_property: str | None = None,
        init_attachments_property: str | None = None,
    ) -> Tool:
        """This prompt as a tool; the call runs it in a child thread and returns its shaped result."""
        fields = input.model_fields
        if init_user_message_property is None and set(fields) == {"message"}:
            init_user_message_property = "message"
        for prop in (init_user_message_property, init_attachments_property):
            if prop is not None and prop not in fields:
                raise ConfigError(f"prompt tool {self.name!r}: {prop!r} is not a field of {input.__name__}")
        options = PromptToolOptions(
            include_text_response=include_text_response,
            include_tool_calls=include_tool_calls,
            include_errors=include_errors,
            init_user_message_property=init_user_message_property,
            init_attachments_property=init_attachments_property,
        )
        definition = tool(
            name=name or self.name.lower().replace("-", "_").replace(".", "_"),
            description=description or f"Run the {self.name} prompt.",
            input=input,
            execute=started_by_the_runtime,
            effect="read_only",
        )
        return replace(definition, child_agent=self, display_name=self.name, prompt_options=options)


def child_message_for(options: PromptToolOptions | None, value: dict[str, Any]) -> Any:
    """The value the child's first user message is made from."""
    if options is not None and options.init_user_message_property is not None:
        return value.get(options.init_user_message_property, "")
    return value


def shape_result(options: PromptToolOptions, summary: str, history: list[Message], error: str | None) -> Any:
    """The return of a prompt tool, from the child thread's messages."""
    shaped: dict[str, Any] = {}
    if options.include_text_response:
        shaped["text"] = summary
    if options.include_tool_calls:
        results = {m.tool_result.call_id: m.tool_result for m in history if m.tool_result is not None}
        shaped["tool_calls"] = [
            {
                "name": c.name,
                "args": _args(c.args),
                "result": results[c.id].content if c.id in results else None,
                "is_error": results[c.id].is_error if c.id in results else False,
            }
            for m in history
            for c in m.tool_calls
        ]
    if options.include_errors:
        errors = [m.tool_result.content for m in history if m.tool_result is not None and m.tool_result.is_error]
        if error:
            errors.append(error)
        shaped["errors"] = errors
    if set(shaped) == {"text"}:
        return summary
    return shaped


def _args(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
