"""An MCP tool's input schema, as the model is given it and as its arguments are checked: an
object schema, checked as JSON Schema before the tool is offered (an invalid or recursive schema
is a ConfigError naming the tool), and each call's arguments validated against it, naming the
failing path and rule, never the value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from threads_celery.definitions.tools import ToolArgumentsError
from threads_celery.exceptions import ConfigError


def object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's input schema, as an object schema a model accepts."""
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def json_schema_validator(
    server: str, tool_name: str, schema: dict[str, Any]
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    # jsonschema comes with the optional mcp extra, the only source of raw JSON schemas.
    import jsonschema
    from jsonschema.exceptions import SchemaError

    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(
            f"MCP server {server!r}: tool {tool_name!r} has an invalid input schema: {exc.message}"
        ) from None
    cycle = reference_cycle(schema)
    if cycle:
        raise ConfigError(
            f"MCP server {server!r}: tool {tool_name!r} has a recursive input schema ({' -> '.join(cycle)}), "
            "which a model cannot be given; leave the tool out with include=[...]"
        )
    validator = cls(schema)

    def validate(values: dict[str, Any]) -> dict[str, Any]:
        problems = []
        for error in sorted(validator.iter_errors(values), key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in error.path) or "(arguments)"
            if error.validator == "required":
                problems.append(f"{where}: {error.message}")  # names the missing key, not a value
            else:
                problems.append(
                    f"{where}: fails {error.validator!r} ({json.dumps(error.validator_value, default=str)})"
                )
        if problems:
            raise ToolArgumentsError("invalid arguments: " + "; ".join(problems))
        return values

    return validate


def reference_cycle(schema: dict[str, Any]) -> list[str]:
    """A chain of local ``$ref`` that comes back to where it started (``#`` is the whole schema),
    or [] for a schema without one."""
    definitions: dict[str, Any] = {"#": schema}
    for key in ("$defs", "definitions"):
        for name, value in (schema.get(key) or {}).items():
            definitions[f"#/{key}/{name}"] = value

    def references(node: Any) -> set[str]:
        found: set[str] = set()
        pending = [node]
        while pending:
            current = pending.pop()
            if isinstance(current, dict):
                ref = current.get("$ref")
                if isinstance(ref, str) and ref in definitions:
                    found.add(ref)
                pending.extend(v for k, v in current.items() if k not in ("$defs", "definitions"))
            elif isinstance(current, list):
                pending.extend(current)
        return found

    edges = {name: references(value) for name, value in definitions.items()}
    visiting: list[str] = []
    done: set[str] = set()

    def walk(name: str) -> list[str]:
        if name in visiting:
            return [*visiting[visiting.index(name) :], name]
        if name in done:
            return []
        visiting.append(name)
        for target in sorted(edges.get(name, ())):
            cycle = walk(target)
            if cycle:
                return cycle
        visiting.pop()
        done.add(name)
        return []

    return walk("#")


__all__ = ["json_schema_validator", "object_schema", "reference_cycle"]
