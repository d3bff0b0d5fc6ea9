"""The HTTP API for web apps (FastAPI): the app, the console, and the caller they serve.

Names are imported lazily, so ``import threads_celery.api.tenancy`` pulls in none of the routes.
``Caller`` is what an app's own authentication answers for ``create_api(threads, caller=...)``,
``create_console(threads, caller=...)`` and ``api_router(threads, caller=...)``, the ``/v1``
routes for the app's own FastAPI app (see docs/fastapi.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Caller": "tenancy",
    "api_router": "router",
    "create_api": "app",
    "create_console": "console",
}

# Written out (not computed from _EXPORTS) so type checkers and linters can read it; a unit
# test keeps the two in step.
__all__ = ["Caller", "api_router", "create_api", "create_console"]

if TYPE_CHECKING:  # names for type checkers; at run time __getattr__ imports them lazily
    from threads_celery.api.app import create_api
    from threads_celery.api.console import create_console
    from threads_celery.api.router import api_router
    from threads_celery.api.tenancy import Caller


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'threads_celery.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
