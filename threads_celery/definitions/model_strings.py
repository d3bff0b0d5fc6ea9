"""The model an agent names: a pydantic-ai model object as it is, or a model string resolved once.

A string such as ``openai:gpt-4o-mini`` is resolved on the first request that needs it, never
at import: a web app that imports an agent's module loads no provider SDK (pydantic-ai's
provider modules are imported inside the functions below for that reason).
"""

from __future__ import annotations

import os
import threading
from typing import Any

_model_cache: dict[str, Any] = {}
_model_cache_lock = threading.Lock()


def resolve_model(model: Any) -> Any:
    """A pydantic-ai Model for a model object or a model string (cached per string)."""
    if not isinstance(model, str):
        return model
    if model.startswith("openai:") and os.environ.get("OPENAI_BASE_URL"):
        # An OpenAI-compatible server speaks chat completions; "openai:" means the Responses API.
        model = "openai-chat:" + model.removeprefix("openai:")
    with _model_cache_lock:
        cached = _model_cache.get(model)
        if cached is None:
            # On the first resolution, not at import (see the module docstring).
            from pydantic_ai.models import infer_model

            cached = _model_cache[model] = infer_model(model, provider_factory=provider_without_sdk_retries)
        return cached


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
