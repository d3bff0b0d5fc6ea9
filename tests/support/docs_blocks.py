"""The code blocks of docs/testing.md, by the file name each one opens with.

A block written as a file a user would save starts with a comment naming it (``# conftest.py``,
``# test_weather.py``, ``# pyproject.toml``); the tests of the pytest plugin write those blocks,
as they are in the page, into a pytester folder and run them, so the page cannot drift from the
code.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"

_FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)

__all__ = ["TESTING_PAGE", "file_blocks"]


def file_blocks(name: str, page: Path = TESTING_PAGE) -> list[str]:
    """The code blocks of ``page`` whose first line is ``# <name>``, in order, that line included."""
    found = [m["body"] for m in _FENCE.finditer(page.read_text(encoding="utf-8"))]
    blocks = [body for body in found if body.splitlines()[0].strip() == f"# {name}"]
    if not blocks:
        raise AssertionError(f"{page.name} has no code block opening with '# {name}'")
    return blocks
