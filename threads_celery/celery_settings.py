"""Users' own Celery settings, merged with ours: a configuration module or object, and variables.

``THREADS_CELERY_CONFIG`` names a module or ``module:attribute`` (a class, an object or a
mapping), read as Celery's ``config_from_object`` reads it: its public lowercase attributes are
settings. ``THREADS_CELERY_<SETTING>`` sets one setting (``THREADS_CELERY_WORKER_PREFETCH_MULTIPLIER=4``),
converted to the setting's type (JSON for mappings and lists). Variables win over the module, and
both win over our defaults, except for the settings that carry the runtime's guarantees
(:data:`GUARDED`: JSON-only id messages, at-least-once delivery) and the broker URL, which is
``THREADS_BROKER_URL``. Everything wrong here is a :class:`ConfigError` at start-up: a module that
does not import, an unknown setting name (with the closest known one), a value of the wrong type,
a guarded setting changed.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any, cast

from threads_celery.exceptions import ConfigError

CONFIG_VARIABLE = "THREADS_CELERY_CONFIG"
SETTING_PREFIX = "THREADS_CELERY_"

#: Settings a user may not change: the runtime's promises rest on them.
GUARDED: Mapping[str, object] = {
    # Task messages carry ids only, as JSON; pickle would let a message run code.
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    # At-least-once: a task whose worker died is delivered again, and the ledger decides.
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
}
#: Settings that have a THREADS_* variable of their own. The time limits and the broker's
#: visibility timeout are checked against each other there (a task must end well inside the time
#: the broker waits before delivering it again), so they are set only there.
OWNED: Mapping[str, str] = {"broker_url": "THREADS_BROKER_URL", "broker_read_url": "THREADS_BROKER_URL",
                            "broker_write_url": "THREADS_BROKER_URL",
                            "task_time_limit": "THREADS_TASK_TIME_LIMIT_S",
                            "task_soft_time_limit": "THREADS_TASK_SOFT_TIME_LIMIT_S"}  # fmt: skip
#: Keys of mapping settings that have a THREADS_* variable of their own.
OWNED_KEYS: Mapping[str, Mapping[str, str]] = {
    "broker_transport_options": {"visibility_timeout": "THREADS_VISIBILITY_TIMEOUT_S"},
    "result_backend_transport_options": {"visibility_timeout": "THREADS_VISIBILITY_TIMEOUT_S"},
}
#: Settings merged key by key with ours instead of replacing them.
MERGED = ("beat_schedule", "broker_transport_options")


@cache
def known_settings() -> dict[str, str]:
    """Every Celery setting name, with its type (``int``, ``dict``, ``any``...)."""
    # Celery is loaded when settings are checked, not when Settings is imported: the definitions
    # import Settings and load no Celery (tests/unit/definitions/test_definitions_imports.py).
    from celery.app.defaults import NAMESPACES, flatten

    # celery-types types flatten() loosely; it yields (name, Option) pairs.
    options = cast("Iterable[tuple[str, Any]]", flatten(NAMESPACES))
    return {name: str(option.type) for name, option in options}


def _unknown(name: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(name, known_settings(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{source}: {name!r} is not a Celery setting{hint}")


def _check(settings: Mapping[str, Any], source: str) -> dict[str, Any]:
    known = known_settings()
    checked: dict[str, Any] = {}
    for name, value in settings.items():
        if name not in known:
            raise _unknown(name, source)
        if name in OWNED:
            raise ConfigError(f"{source}: set {OWNED[name]} instead of the Celery setting {name!r}")
        for key, variable in OWNED_KEYS.get(name, {}).items():
            if isinstance(value, Mapping) and key in value:
                raise ConfigError(f"{source}: set {variable} instead of {name}[{key!r}]")
        if name in GUARDED and value != GUARDED[name]:
            raise ConfigError(
                f"{source}: {name}={value!r} would break the runtime's delivery guarantees "
                f"(it must stay {GUARDED[name]!r})"
            )
        checked[name] = value
    return checked


def settings_of_object(obj: object, source: str) -> dict[str, Any]:
    """The settings a configuration module, class, object or mapping holds, checked."""
    if isinstance(obj, Mapping):
        items = {str(k): v for k, v in obj.items()}
    else:
        items = {name: getattr(obj, name) for name in dir(obj) if not name.startswith("_") and name.islower()}
        # Helpers next to the settings (imported modules, functions, classes) are not settings.
        items = {
            name: value
            for name, value in items.items()
            if not (inspect.ismodule(value) or inspect.isroutine(value) or inspect.isclass(value))
        }
    return _check(items, source)


def load_config_object(spec: str) -> dict[str, Any]:
    """The settings of ``module`` or ``module:attribute`` (ConfigError when it does not load)."""
    source = f"{CONFIG_VARIABLE}={spec}"
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a module that fails to import, whatever the cause, is a configuration error
        raise ConfigError(f"{source}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    obj: object = module
    if attribute:
        if not hasattr(module, attribute):
            raise ConfigError(f"{source}: module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(module, attribute)
    return settings_of_object(obj, source)


def _convert(name: str, kind: str, raw: str, variable: str) -> object:
    try:
        if kind in ("dict", "tuple"):
            value = json.loads(raw)
            expected = dict if kind == "dict" else list
            if not isinstance(value, expected):
                raise ValueError(f"expected a JSON {'object' if kind == 'dict' else 'array'}")
            return value
        if kind == "any":
            try:
                return json.loads(raw)
            except ValueError:
                return raw
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError("expected true or false")
            return lowered in ("1", "true", "yes", "on")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return raw
    except ValueError as exc:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ConfigError(f"{variable}={raw!r}: {name} takes {article} {kind} value ({exc})") from None


def settings_of_variables(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings named by ``THREADS_CELERY_<SETTING>`` variables, converted and checked."""
    known = known_settings()
    found: dict[str, Any] = {}
    for variable, raw in env.items():
        if not variable.startswith(SETTING_PREFIX) or variable == CONFIG_VARIABLE:
            continue
        name = variable.removeprefix(SETTING_PREFIX).lower()
        if name not in known:
            raise _unknown(name, variable)
        found[name] = _convert(name, known[name], raw, variable)
    return _check(found, "THREADS_CELERY_*")


def user_celery_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The user's Celery settings: the configuration object's, then the variables' on top."""
    settings: dict[str, Any] = {}
    spec = (env.get(CONFIG_VARIABLE) or "").strip()
    if spec:
        settings.update(load_config_object(spec))
    settings.update(settings_of_variables(env))
    return settings


def merge_celery_settings(ours: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """``user`` over ``ours``; mappings in :data:`MERGED` are merged key by key (the reconcile
    backbone stays in ``beat_schedule`` whatever the user schedules), the user's ``task_routes``
    come after ours (control tasks keep their queue), guarded settings are ours."""
    _check(user, "Celery settings")
    merged = dict(ours)
    for name, value in user.items():
        if name == "task_routes" and ours.get(name):
            # Ours first: the backbone's control tasks keep their queue whatever the user routes.
            extra = list(value) if isinstance(value, list | tuple) else [value]
            merged[name] = [ours[name], *extra]
        elif name in MERGED and isinstance(value, Mapping) and isinstance(ours.get(name), Mapping):
            merged[name] = {**ours[name], **value}
        else:
            merged[name] = value
    return merged
