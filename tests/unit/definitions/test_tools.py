"""Tool definitions: every ConfigError of ``tool()``, argument parsing and result rendering."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from threads_celery import Found, Reconcile, tool
from threads_celery.definitions.tools import (
    RESERVED_TOOL_NAMES,
    Tool,
    ToolArgumentsError,
    ToolOutputError,
    render_result,
)
from threads_celery.exceptions import ConfigError


class WeatherIn(BaseModel):
    city: str = Field(description="City name, e.g. Paris")
    unit: Literal["c", "f"] = "c"
    days: int = 1


class WeatherOut(BaseModel):
    city: str
    temperature: float


def _execute(inp: Any, ctx: Any) -> dict[str, Any]:
    return {"city": inp.city, "temperature": 21}


def _lookup(effect_key: str) -> Found:
    return Found("done")


def make(**overrides: Any) -> Tool:
    options: dict[str, Any] = {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "input": WeatherIn,
        "execute": _execute,
    }
    options.update(overrides)
    return tool(**options)


# -- definition-time errors ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["GetWeather", "get-weather", "1weather", "", "get weather", "_private"])
def test_bad_names_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError, match="lowercase letters, digits and underscores") as info:
        make(name=name)
    assert repr(name) in str(info.value)


def test_a_name_that_is_not_a_string_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid"):
        make(name=None)


@pytest.mark.parametrize("name", sorted(RESERVED_TOOL_NAMES))
def test_reserved_names_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError, match="reserved") as info:
        make(name=name)
    assert repr(name) in str(info.value)


def test_the_reserved_names_are_the_subagent_lifecycle_tools() -> None:
    assert {"subagents", "subagent_create", "subagent_message"} == RESERVED_TOOL_NAMES


def test_dedup_window_without_idempotent_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="dedup_window_ms is only for effect='idempotent'"):
        make(effect="unguarded", dedup_window_ms=60_000)


def test_idempotent_without_dedup_window_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="effect='idempotent' needs dedup_window_ms"):
        make(effect="idempotent")


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "60000"])
def test_dedup_window_must_be_a_positive_integer(window: Any) -> None:
    with pytest.raises(ConfigError, match="dedup_window_ms must be a positive integer"):
        make(effect="idempotent", dedup_window_ms=window)


def test_reconcile_without_reconcilable_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="reconcile is only for effect='reconcilable'"):
        make(effect="idempotent", dedup_window_ms=1000, reconcile=Reconcile(finality="final", lookup=_lookup))


def test_reconcilable_without_reconcile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"effect='reconcilable' needs reconcile=Reconcile"):
        make(effect="reconcilable")


def test_reconcilable_with_something_other_than_reconcile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"needs reconcile=Reconcile"):
        make(effect="reconcilable", reconcile=_lookup)


def test_runs_sandbox_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="runs='sandbox' is not supported"):
        make(runs="sandbox")


def test_an_unknown_runs_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="runs must be 'host'"):
        make(runs="cloud")


def test_an_unknown_effect_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="effect must be one of read_only, idempotent, reconcilable, unguarded"):
        make(effect="dangerous")


def test_a_progress_argument_that_is_not_a_field_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="progress_argument 'status' is not a field of WeatherIn"):
        make(progress_argument="status")


def test_a_progress_argument_that_is_not_a_str_field_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="progress_argument 'days' must be a str field"):
        make(progress_argument="days")


def test_a_progress_argument_that_is_a_literal_is_not_a_str_field() -> None:
    with pytest.raises(ConfigError, match="must be a str field"):
        make(progress_argument="unit")


def test_a_str_progress_argument_builds() -> None:
    assert make(progress_argument="city").progress_argument == "city"


@pytest.mark.parametrize("description", ["", "   ", None])
def test_a_missing_description_is_a_config_error(description: Any) -> None:
    with pytest.raises(ConfigError, match="needs a description"):
        make(description=description)


@pytest.mark.parametrize("bad_input", [dict, {"city": str}, WeatherIn(city="Paris"), None])
def test_an_input_that_is_not_a_basemodel_class_is_a_config_error(bad_input: Any) -> None:
    with pytest.raises(ConfigError, match="input must be a pydantic BaseModel class"):
        make(input=bad_input)


def test_an_execute_that_is_not_callable_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="execute must be callable"):
        make(execute="not a function")


def test_an_empty_queue_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="queue must be a non-empty string"):
        make(queue="")


def test_config_error_is_a_value_error_for_callers_that_catch_those() -> None:
    with pytest.raises(ValueError):
        make(name="Bad")


# -- every effect builds -------------------------------------------------------------------------


def test_a_read_only_tool_builds() -> None:
    t = make(effect="read_only")
    assert (t.effect, t.dedup_window_ms, t.reconcile, t.runs) == ("read_only", None, None, "host")


def test_an_unguarded_tool_builds_and_unguarded_is_the_default() -> None:
    t = make()
    assert t.effect == "unguarded"
    assert make(effect="unguarded").effect == "unguarded"


def test_an_idempotent_tool_builds() -> None:
    t = make(effect="idempotent", dedup_window_ms=86_400_000)
    assert (t.effect, t.dedup_window_ms) == ("idempotent", 86_400_000)


def test_a_reconcilable_tool_builds() -> None:
    reconcile = Reconcile(finality="final", lookup=_lookup)
    t = make(effect="reconcilable", reconcile=reconcile)
    assert t.effect == "reconcilable"
    assert t.reconcile is reconcile


def test_a_tool_keeps_its_options() -> None:
    t = make(effect="read_only", ends_turn=True, output=WeatherOut, queue="slow")
    assert t.name == "get_weather"
    assert t.description == "Get the current weather for a city."
    assert t.ends_turn is True
    assert t.output is WeatherOut
    assert t.queue == "slow"
    assert t.is_async is False


def test_an_async_execute_is_detected() -> None:
    async def fetch(inp: Any, ctx: Any) -> str:
        return "ok"

    assert make(execute=fetch).is_async is True


def test_the_schema_the_model_sees_is_the_input_models() -> None:
    schema = make().parameters_json_schema()
    assert set(schema["properties"]) == {"city", "unit", "days"}
    assert schema["required"] == ["city"]
    assert schema["properties"]["city"]["description"] == "City name, e.g. Paris"
    # Unknown keys are refused, and the schema says so.
    assert schema["additionalProperties"] is False


# -- parsing the model's arguments ---------------------------------------------------------------


def test_json_arguments_parse_into_the_input_model() -> None:
    parsed = make().parse_arguments('{"city": "Paris", "unit": "f"}')
    assert isinstance(parsed, WeatherIn)
    assert (parsed.city, parsed.unit, parsed.days) == ("Paris", "f", 1)


def test_mapping_arguments_parse_too() -> None:
    parsed = make().parse_arguments({"city": "Oslo"})
    assert parsed.city == "Oslo"  # type: ignore[attr-defined]


def test_unknown_keys_are_rejected() -> None:
    with pytest.raises(ToolArgumentsError, match="invalid arguments: country: Extra inputs are not permitted"):
        make().parse_arguments('{"city": "Paris", "country": "FR"}')


def test_unknown_keys_are_rejected_even_when_the_model_allows_them() -> None:
    class Lenient(BaseModel):
        model_config = ConfigDict(extra="allow")
        city: str

    with pytest.raises(ToolArgumentsError, match="country"):
        make(input=Lenient).parse_arguments({"city": "Paris", "country": "FR"})


def test_the_users_model_class_is_not_changed() -> None:
    make()
    # WeatherIn itself still ignores extra keys, as pydantic does by default.
    assert WeatherIn.model_validate({"city": "Paris", "country": "FR"}).city == "Paris"


def test_a_model_that_already_forbids_extra_keys_is_used_as_is() -> None:
    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        city: str

    assert make(input=Strict).input is Strict


def test_a_missing_required_field_names_the_field() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        make().parse_arguments('{"unit": "c"}')
    assert str(info.value) == "invalid arguments: city: Field required"


def test_a_wrong_type_names_the_field_without_echoing_the_value() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        make().parse_arguments('{"city": "Paris", "days": "sk-secret-looking-value"}')
    message = str(info.value)
    assert message.startswith("invalid arguments: days: ")
    assert "sk-secret-looking-value" not in message


def test_several_problems_are_all_reported() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        make().parse_arguments('{"unit": "k"}')
    message = str(info.value)
    assert "city: Field required" in message
    assert "unit: " in message


@pytest.mark.parametrize("raw", ['{"city": "Paris"', "city=Paris", "{'city': 'Paris'}", "nul"])
def test_malformed_json_is_a_clear_arguments_error(raw: str) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        make().parse_arguments(raw)
    message = str(info.value)
    assert message.startswith("the arguments are not valid JSON (")
    assert "at position" in message
    assert message.endswith("send one JSON object")


@pytest.mark.parametrize(
    ("raw", "kind"), [("[1, 2]", "list"), ('"Paris"', "str"), ("42", "int"), ("null", "NoneType"), (["x"], "list")]
)
def test_arguments_that_are_not_an_object_are_a_clear_error(raw: Any, kind: str) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        make().parse_arguments(raw)
    assert str(info.value) == f"the arguments must be a JSON object, not {kind}"


@pytest.mark.parametrize("raw", [None, ""])
def test_no_arguments_mean_an_empty_object(raw: Any) -> None:
    class NoArgs(BaseModel):
        pass

    assert isinstance(make(input=NoArgs).parse_arguments(raw), NoArgs)
    with pytest.raises(ToolArgumentsError, match="city: Field required"):
        make().parse_arguments(raw)


def test_arguments_errors_are_value_errors() -> None:
    assert issubclass(ToolArgumentsError, ValueError)
    assert issubclass(ToolOutputError, ValueError)


# -- what the model sees for a result ---------------------------------------------------------


def test_a_string_result_is_shown_as_is() -> None:
    assert render_result("It is 21 degrees.") == "It is 21 degrees."
    assert render_result('{"not": "reencoded"}') == '{"not": "reencoded"}'
    assert render_result("") == ""


def test_a_dict_result_is_json() -> None:
    rendered = render_result({"city": "Paris", "temperature": 21, "ok": True, "none": None})
    assert json.loads(rendered) == {"city": "Paris", "temperature": 21, "ok": True, "none": None}


def test_a_list_result_is_json() -> None:
    assert json.loads(render_result([1, "two", {"three": 3}])) == [1, "two", {"three": 3}]


def test_a_basemodel_result_is_json() -> None:
    assert json.loads(render_result(WeatherOut(city="Paris", temperature=21.5))) == {
        "city": "Paris",
        "temperature": 21.5,
    }


def test_numbers_and_none_are_json() -> None:
    assert render_result(42) == "42"
    assert render_result(None) == "null"


def test_nan_and_the_infinities_are_null_so_the_text_stays_json() -> None:
    rendered = render_result({"nan": float("nan"), "up": float("inf"), "down": [float("-inf"), 1.5]})
    assert json.loads(rendered, parse_constant=lambda name: pytest.fail(f"{name} is not JSON")) == {
        "nan": None,
        "up": None,
        "down": [None, 1.5],
    }


# -- the output model -----------------------------------------------------------------------------


def test_a_result_that_fits_the_output_model_is_validated() -> None:
    t = make(output=WeatherOut)
    checked = t.check_output({"city": "Paris", "temperature": 21})
    assert checked == WeatherOut(city="Paris", temperature=21.0)
    assert json.loads(render_result(checked)) == {"city": "Paris", "temperature": 21.0}


def test_a_result_that_fails_the_output_model_is_a_tool_output_error() -> None:
    t = make(output=WeatherOut)
    with pytest.raises(ToolOutputError) as info:
        t.check_output({"city": "Paris"})
    message = str(info.value)
    assert message.startswith("tool 'get_weather' returned a result that fails its output schema: ")
    assert "temperature: Field required" in message


def test_an_output_type_that_is_not_a_model_works_too() -> None:
    t = make(output=list[int])
    assert t.check_output([1, 2]) == [1, 2]
    with pytest.raises(ToolOutputError):
        t.check_output(["one"])


def test_without_an_output_model_the_result_is_passed_through() -> None:
    value = object()
    assert make().check_output(value) is value


# -- the fingerprint a thread is pinned to ---------------------------------------------------------


def test_the_fingerprint_is_stable_and_follows_the_definition() -> None:
    assert make().fingerprint() == make().fingerprint()
    assert make().fingerprint() != make(description="Another description.").fingerprint()
    assert make().fingerprint() != make(effect="read_only").fingerprint()
    assert make().fingerprint() != make(ends_turn=True).fingerprint()
    # The function body is code, not configuration: swapping it keeps the fingerprint.
    assert make().fingerprint() == make(execute=lambda inp, ctx: "other").fingerprint()


def test_the_fingerprint_is_worked_out_once_per_tool_and_not_carried_to_a_replaced_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    t = make()
    built: list[str] = []
    schema = t.input.model_json_schema
    monkeypatch.setattr(t.input, "model_json_schema", lambda: built.append("schema") or schema())
    first = t.fingerprint()
    assert t.fingerprint() == first and built == ["schema"]
    changed = dataclasses.replace(t, description="Another description.")
    assert changed.fingerprint() != first and built == ["schema", "schema"]
    assert changed == dataclasses.replace(changed)  # the cache takes no part in equality
