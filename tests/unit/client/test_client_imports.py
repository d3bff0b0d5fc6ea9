"""What a web app imports: the client pulls in neither the model layer nor any tool code, nor
the worker side (the Celery tasks, the runtime that runs them).

Each check runs in a fresh interpreter, so modules imported by other tests cannot hide a leak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT

# Where a web app's process would find the worker-side agent code if it were (wrongly) imported.
TOOL_MODULE = "webapp_agents_for_import_test"
TOOL_MODULE_SOURCE = textwrap.dedent(
    """
    from pydantic import BaseModel

    from threads_celery import Agent, tool
    from threads_celery.testing import ScriptedModel, say


    class Order(BaseModel):
        order_id: str


    refund = tool(
        name="refund",
        description="Refund an order.",
        input=Order,
        effect="unguarded",
        execute=lambda inp, ctx: "refunded",
    )
    support = Agent(name="support", instructions="Help.", model=ScriptedModel([say("ok")]), tools=[refund])
    """
)

FORBIDDEN_PREFIXES = (
    "pydantic_ai",
    "openai",
    "anthropic",
    TOOL_MODULE,
    "tests",
    # The worker side: a web app publishes, and loads only what the workers share to send tasks
    # (threads_celery.transitions.publishing).
    "threads_celery.worker",
    "threads_celery.runtime",
    "tasks",
    "beat",
)
FORBIDDEN_MODULES = ("threads_celery.runtime.models", "threads_celery.testing")

REPORT = textwrap.dedent(
    """
    import json, sys
    print(json.dumps(sorted(sys.modules)))
    """
)


def imported_modules(code: str, *, extra_path: Path | None = None, env: dict[str, str] | None = None) -> list[str]:
    """The module names loaded after running ``code`` in a fresh interpreter."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("THREADS_")}
    python_path = [str(REPO_ROOT)] + ([str(extra_path)] if extra_path else [])
    environment["PYTHONPATH"] = os.pathsep.join(python_path)
    environment.update(env or {})
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + REPORT],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def leaks(modules: list[str]) -> list[str]:
    return [
        m for m in modules if m in FORBIDDEN_MODULES or any(m == p or m.startswith(p + ".") for p in FORBIDDEN_PREFIXES)
    ]


@pytest.fixture
def tool_module(tmp_path: Path) -> Path:
    (tmp_path / f"{TOOL_MODULE}.py").write_text(TOOL_MODULE_SOURCE)
    return tmp_path


def test_importing_the_client_module_loads_no_model_layer_or_tool_code(tool_module: Path) -> None:
    modules = imported_modules(
        "import threads_celery.client.threads",
        extra_path=tool_module,
        env={"THREADS_AGENTS": TOOL_MODULE},
    )
    assert "threads_celery.client.threads" in modules
    assert leaks(modules) == []


def test_importing_the_client_package_loads_no_worker_runtime_or_model_layer(tool_module: Path) -> None:
    modules = imported_modules(
        "import threads_celery.client", extra_path=tool_module, env={"THREADS_AGENTS": TOOL_MODULE}
    )
    # It publishes through the doorbell the workers share, and loads nothing of theirs.
    assert "threads_celery.client" in modules and "threads_celery.transitions.publishing" in modules
    assert leaks(modules) == []


def test_importing_threads_from_the_package_loads_no_model_layer_or_tool_code(tool_module: Path) -> None:
    modules = imported_modules(
        "from threads_celery import Threads",
        extra_path=tool_module,
        env={"THREADS_AGENTS": TOOL_MODULE},
    )
    assert "threads_celery.client.threads" in modules
    assert leaks(modules) == []


def test_a_web_app_starts_a_run_by_name_without_loading_tool_code(tool_module: Path, tmp_path: Path) -> None:
    # A worker-side process registers the agent in the ledger...
    database = tmp_path / "ledger.db"
    register = f"""
        from threads_celery import Threads
        from {TOOL_MODULE} import support
        with Threads(database_url="sqlite:///{database}", broker_url="memory://") as threads:
            threads.register(support)
    """
    imported_modules(register, extra_path=tool_module)

    # ...and the web app starts runs by name, with the agents' module on its path and in its env.
    web_app = f"""
        from threads_celery import Threads
        with Threads(database_url="sqlite:///{database}", broker_url="memory://") as threads:
            handle = threads.start("support", "where is my refund?")
            assert threads.get_run(handle.run_id).status == "queued"
            assert [m.text for m in threads.messages(handle.thread_id)] == ["where is my refund?"]
    """
    modules = imported_modules(web_app, extra_path=tool_module, env={"THREADS_AGENTS": TOOL_MODULE})
    assert "threads_celery.client.threads" in modules
    assert leaks(modules) == []


def test_the_check_itself_sees_a_leak(tool_module: Path) -> None:
    # The worker side does load the tools and the model layer: the check must notice.
    modules = imported_modules(f"import {TOOL_MODULE}", extra_path=tool_module)
    found = leaks(modules)
    assert TOOL_MODULE in found
    assert "threads_celery.testing" in found
    assert any(m.startswith("pydantic_ai") for m in found)


def test_the_worker_side_is_loaded_only_when_this_process_starts_a_worker(tmp_path: Path) -> None:
    # The one place the client imports worker code: when this process is to run tasks itself.
    modules = imported_modules(
        f"""
        import sys
        from threads_celery import Threads
        threads = Threads(embedded_path="{tmp_path / "ledger.db"}")
        assert not [m for m in sys.modules if m.startswith("threads_celery.worker")]
        threads.start_worker()
        assert "threads.step" in threads.app.tasks
        threads.close()
        """
    )
    assert "threads_celery.worker.embedded" in modules and "threads_celery.runtime.machine" in modules
