"""Helpers for tests that need PostgreSQL or Redis on loopback.

Locally a missing service skips the test; under CI (``CI=true`` or ``CI=1``)
it fails it, so CI can never go green by silently skipping.
"""

from __future__ import annotations

import os

import pytest

__all__ = ["in_ci", "require_service"]


def in_ci() -> bool:
    """True when the environment variable ``CI`` is ``true`` or ``1`` (any case)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1"}


def require_service(name: str, reachable: bool, detail: str, *, address: str | None = None) -> None:
    """Skip (locally) or fail (under CI) the current test when ``name`` is not reachable.

    Does nothing when ``reachable`` is true.
    """
    if reachable:
        return
    where = f" at {address}" if address else ""
    message = f"{name} not reachable{where}: {detail}"
    if in_ci():
        pytest.fail(f"{message} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(message)
