"""The suite's own layout: what pytest needs to collect every test file of a clean clone.

The test folders are not packages (pytest's default import mode puts each file's folder on
``sys.path`` and imports it by its basename), so two test files with one basename make the
second folder's collection fail with "import file mismatch" on a clean clone, while a
checkout whose cache already holds both may pass.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _modules_by_basename() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        if "__pycache__" in path.parts or path.name in {"__init__.py", "conftest.py"}:
            continue
        package = path.parent / "__init__.py"
        if package.exists():
            continue  # imported by its dotted name, so its basename may repeat
        found[path.name].append(str(path.relative_to(TESTS)))
    return found


def test_no_two_test_modules_share_a_basename() -> None:
    clashes = {name: paths for name, paths in _modules_by_basename().items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"


def test_the_layout_check_sees_the_suite() -> None:
    found = _modules_by_basename()
    assert "test_suite_layout.py" in found
    assert len(found) > 100
