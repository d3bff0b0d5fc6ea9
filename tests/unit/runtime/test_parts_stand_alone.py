"""The step machine's parts stand alone: none of them imports the machine, even for type hints.

Each part of ``threads_celery/runtime/`` takes what it needs of its worker through the narrow
protocols of ``runtime/ports.py`` (or plain arguments), so it can be read without ``machine.py``
and the modules form no circle. import-linter's contracts skip imports under ``TYPE_CHECKING``;
this test reads every import, those included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import threads_celery.runtime

RUNTIME = Path(threads_celery.runtime.__file__).parent
MACHINE = "threads_celery.runtime.machine"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_part_imports_the_machine() -> None:
    parts = [p for p in RUNTIME.glob("*.py") if p.name not in ("machine.py", "__init__.py")]
    assert len(parts) > 10
    importing = sorted(p.name for p in parts if any(n == MACHINE or n.startswith(f"{MACHINE}.") for n in _imports(p)))
    assert importing == [], f"these parts import the machine: {importing} (take a protocol of runtime/ports.py)"


def test_no_part_reaches_into_the_runtimes_private_names() -> None:
    offenders = []
    for path in RUNTIME.glob("*.py"):
        if path.name == "machine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in ("runtime", "rt", "worker", "ledger")
            ):
                offenders.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    assert offenders == []
