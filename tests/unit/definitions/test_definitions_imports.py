"""What declaring agents costs: the definitions load neither the store, nor the runtime, nor any
face, nor the I/O libraries under them (importing a definition does no I/O).

Each check runs in a fresh interpreter, so modules imported by other tests cannot hide a leak.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import textwrap

import threads_celery.definitions
from tests.support.processes import REPO_ROOT

DEFINITIONS = sorted(
    m.name for m in pkgutil.iter_modules(threads_celery.definitions.__path__, "threads_celery.definitions.")
)

FORBIDDEN_PREFIXES = (
    "threads_celery.store",
    "threads_celery.transitions",
    "threads_celery.telemetry",
    "threads_celery.runtime",
    "threads_celery.client",
    "threads_celery.api",
    "threads_celery.cli",
    "threads_celery.worker",
    "sqlalchemy",
    "celery",
    "kombu",
    "redis",
    "psycopg",
)

AN_AGENT_MODULE = """
    from pydantic import BaseModel

    from threads_celery import Agent, Detached, Prompt, SubagentRelationship, Variable, agent_tool, tool


    class Question(BaseModel):
        text: str


    ask = tool(name="ask", description="Ask.", input=Question, effect="read_only", execute=lambda inp, ctx: "ok")
    helper = Agent(name="helper", instructions="Help.", model="test", tools=[ask], variables=[Variable("TOKEN")])
    summary = Prompt(name="summary", instructions="Sum up.", model="test")
    lead = Agent(
        name="lead",
        instructions="Lead.",
        model="test",
        tools=[agent_tool(helper, "A helper."), summary.as_tool()],
        subagents=[SubagentRelationship("aide", helper)],
    )
    assert Detached(notify=True)
"""


def imported_modules(code: str) -> list[str]:
    """The module names loaded after running ``code`` in a fresh interpreter."""
    report = "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_")}
    environment["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + report],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def leaks(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in FORBIDDEN_PREFIXES)]


def test_every_definitions_module_imports_without_the_store_the_runtime_or_a_face() -> None:
    modules = imported_modules("\n".join(f"import {name}" for name in DEFINITIONS))
    assert set(DEFINITIONS) <= set(modules)
    assert leaks(modules) == []


def test_declaring_agents_and_their_tools_loads_no_store_runtime_or_face() -> None:
    modules = imported_modules(AN_AGENT_MODULE)
    assert "threads_celery.definitions.agent_tools" in modules
    assert leaks(modules) == []


def test_the_check_itself_sees_a_leak() -> None:
    # The runtime's side of the hooks records changed arguments in the ledger: it loads the store.
    found = leaks(imported_modules("import threads_celery.runtime.hooks"))
    assert "threads_celery.runtime.hooks" in found and "threads_celery.store" in found and "sqlalchemy" in found
