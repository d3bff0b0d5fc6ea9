"""Waiting with a deadline: the one way tests wait for something to happen.

A test never sleeps and hopes: it polls a probe until the probe answers something truthy, and
fails with what it was waiting for (and the last thing it saw) when the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0

__all__ = ["DEFAULT_TIMEOUT_S", "Deadline", "eventually"]


def eventually(
    probe: Callable[[], T],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    detail: Callable[[], object] | None = None,
    interval: float = 0.1,
) -> T:
    """Call ``probe`` until it returns something truthy and return that.

    Polls quickly at first (5 ms, growing to ``interval``). After ``timeout`` seconds raises
    AssertionError naming ``what`` and showing ``detail()`` (or the probe's last answer).
    """
    deadline = time.monotonic() + timeout
    delay = min(0.005, interval)
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = detail() if detail is not None else value
            raise AssertionError(f"{what} did not happen within {timeout:g}s (last seen: {seen!r})")
        time.sleep(delay)
        delay = min(delay * 1.5, interval)


class Deadline:
    """A point in time a loop must finish by: ``while not deadline.passed(): ...``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def check(self, what: str) -> None:
        """AssertionError when the deadline has passed."""
        if self.passed():
            raise AssertionError(f"{what} did not happen within {self.seconds:g}s")
