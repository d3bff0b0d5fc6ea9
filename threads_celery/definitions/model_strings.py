"""The model an agent names: a pydantic-ai model object as it is, or a model string resolved once.

A string such as ``openai:gpt-4o-mini`` is resolved on the first request that needs it, never
at import: a web app that imports an agent's module loads no provider SDK (pydantic-ai's
provider modules are imported inside the functions below for that reason).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import weakref
from functools import cache
from importlib.metadata import PackageNotFoundError, metadata
from typing import Any

from threads_celery.exceptions import ModelUnavailable

#: Models built from strings, per event loop. A model's provider holds an HTTP client whose
#: connection pool belongs to the loop it first ran on. Shared with a thread that runs a loop of its
#: own (``-P threads``, ``Threads.embedded()``), a request goes out, is answered and billed, and
#: only then fails with "bound to a different event loop": the step is retried and billed again.
_loop_models: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()
#: The same, for a resolution made outside any running loop: per thread.
_thread_models = threading.local()
_lock = threading.Lock()


def resolve_model(model: Any) -> Any:
    """A pydantic-ai Model for a model object or a model string.

    A string's model is built once per event loop (once per thread outside a loop) and never
    shared between loops: see ``_loop_models``.
    """
    if not isinstance(model, str):
        return model
    if model.startswith("openai:") and os.environ.get("OPENAI_BASE_URL"):
        # An OpenAI-compatible server speaks chat completions; "openai:" means the Responses API.
        model = "openai-chat:" + model.removeprefix("openai:")
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    with _lock:
        if loop is not None:
            models = _loop_models.get(loop)
            if models is None:
                models = _loop_models[loop] = {}
        else:
            models = getattr(_thread_models, "models", None)
            if models is None:
                models = _thread_models.models = {}
        cached = models.get(model)
        if cached is None:
            # On the first resolution, not at import (see the module docstring).
            from pydantic_ai.exceptions import UserError
            from pydantic_ai.models import infer_model

            try:
                cached = models[model] = infer_model(model, provider_factory=provider_without_sdk_retries)
            except UserError as exc:
                # No API key, an unknown provider or model name: what the operator must fix, and
                # no request was made. Every try would fail the same way.
                raise ModelUnavailable(f"model {model!r} cannot be used here: {_first_line(exc)}") from None
        return cached


def missing_provider_package(model: object) -> str | None:
    """Why ``model``'s provider package cannot be imported in this process, as one line naming the
    extra to install; None when it can, or when ``model`` is not a string (a model object's package
    was imported by the code that built it).

    Only the provider's class is imported (no client is built, no API key is read): cheap enough
    for every entry point to ask before it records a run, and for a worker before each step. An
    adapted Pydantic AI agent's lazy model is checked by the string it wraps.
    """
    model = getattr(model, "unresolved_spec", None) or model
    if not isinstance(model, str):
        return None
    return _missing_package(model)


def check_model_package(model: object, *, agent: str | None = None) -> None:
    """:class:`~threads_celery.exceptions.ModelUnavailable` (naming ``agent``, when given) if the
    model's provider package is not installed here (see :func:`missing_provider_package`)."""
    problem = missing_provider_package(model)
    if problem is not None:
        raise ModelUnavailable(f"agent {agent!r}: {problem}" if agent is not None else problem)


def check_model_usable(model: object, *, agent: str | None = None) -> None:
    """:class:`~threads_celery.exceptions.ModelUnavailable` (naming ``agent``, when given) if a
    model string cannot be used in this process: its provider package is not installed, or its
    provider cannot be built (no API key in the environment, an unknown provider).

    What a worker checks before each model step (so such a run ends at its first step, without
    retrying), and what an embedded runtime checks before it records a run. The model is built
    once per thread and kept (:func:`resolve_model`), so this is a lookup after the first time.
    """
    check_model_package(model, agent=agent)
    spec = getattr(model, "unresolved_spec", None) or model
    if not isinstance(spec, str):
        return
    try:
        resolve_model(spec)
    except ModelUnavailable as exc:
        raise ModelUnavailable(f"agent {agent!r}: {exc.message}" if agent is not None else exc.message) from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@cache
def _missing_package(model: str) -> str | None:
    # On the first check, not at import (see the module docstring).
    from pydantic_ai.models import parse_model_id
    from pydantic_ai.providers import infer_provider_class

    provider, _ = parse_model_id(model)
    if provider is None:
        return None  # not "provider:name": pydantic-ai says what is wrong with it where it is used
    try:
        infer_provider_class(provider)
    except ImportError as exc:
        hint = our_extra(str(exc))
        match = _INSTALL_HINT.search(hint)
        how = f"install it with {match[0].strip('`')}" if match else hint.strip().splitlines()[0]
        return f"model {model!r} needs its provider package, which is not installed: {how}"
    except Exception:  # noqa: BLE001 - an unknown provider is pydantic-ai's to explain, where it is used
        return None
    return None


_SLIM_EXTRA = re.compile(r"""`?pip install ["']?pydantic-ai-slim\[(?P<extra>[\w-]+)\]["']?`?""")
_INSTALL_HINT = re.compile(r"""`?pip install ["']?[\w-]+\[[\w-]+\]["']?`?""")


def our_extra(message: str) -> str:
    """Pydantic AI's "install pydantic-ai-slim[X]" hint, as ``threads-celery[X]`` where we have X.

    The project's own extras pin the provider packages it is tested with; a provider it has no
    extra for keeps Pydantic AI's hint.
    """
    match = _SLIM_EXTRA.search(message)
    if match is None or match["extra"] not in _project_extras():
        return message
    return message.replace(match[0], f"`pip install 'threads-celery[{match['extra']}]'`")


@cache
def _project_extras() -> frozenset[str]:
    try:
        return frozenset(metadata("threads-celery").get_all("Provides-Extra") or ())
    except PackageNotFoundError:  # run from a source tree that is not installed
        return frozenset()


def provider_without_sdk_retries(name: str) -> Any:
    """pydantic-ai's provider for ``name``, with the OpenAI SDK's own retries turned off.

    The SDK would wait out a 429 or a 5xx itself, inside the worker slot; the runtime retries the
    step instead, as a Celery countdown that holds no slot (see threads_celery.decisions.provider_limits).
    """
    # On the first resolution, not at import (see the module docstring).
    from pydantic_ai.providers import infer_provider

    provider = infer_provider(name)
    try:
        from pydantic_ai.providers.openai import OpenAIProvider  # the optional openai extra
    except ImportError:  # pragma: no cover - the openai extra is not installed
        return provider
    if type(provider) is OpenAIProvider:
        return OpenAIProvider(openai_client=provider.client.with_options(max_retries=0))
    return provider


def forget_models() -> None:
    """Drop every model built from a string, so the next resolution reads the environment again
    (``OPENAI_BASE_URL``, keys): for tests that point a model string at a server of their own."""
    with _lock:
        _loop_models.clear()
        _thread_models.models = {}
