"""Worker, Beat and API refuse to start, in one line and with exit status 2, when they cannot work.

Each case starts the real command (``celery -A tasks worker``, ``celery -A tasks beat``,
``threads-celery worker|beat|api``) against a misconfiguration and checks the refusal: one
``error:`` line naming the cause, no traceback, exit status 2, and no "ready" before it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120

AGENT_MODULES = {
    "broken_agents": "from threads_celery import Agent\nraise RuntimeError('agent module exploded at import')\n",
    "keyed_agents": (
        "from threads_celery import Agent\n"
        "needs_key = Agent(name='needs-key', instructions='x', model='openai:gpt-4o-mini')\n"
    ),
    "scripted_agents": (
        "from threads_celery import Agent\n"
        "from threads_celery.testing import ScriptedModel, say\n"
        "ok = Agent(name='scripted-ok', instructions='x', model=ScriptedModel([say('hi')]))\n"
    ),
}

WORKER = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "solo", "-l", "INFO"]
BEAT = [sys.executable, "-m", "celery", "-A", "tasks", "beat", "-l", "INFO"]
CLI_WORKER = [sys.executable, "-m", "threads_celery.cli.app", "worker", "--pool", "solo"]
CLI_BEAT = [sys.executable, "-m", "threads_celery.cli.app", "beat"]
CLI_API = [sys.executable, "-m", "threads_celery.cli.app", "api", "--port", "1"]


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    for name, source in AGENT_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    return tmp_path


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/nothing_listens_here"


def start(argv: list[str], cwd: Path, **env_vars: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADS_", "CELERY_", "OPENAI_"))}
    env.update(PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{cwd}", PYTHONUNBUFFERED="1", THREADS_API_TOKENS="t")
    env.update({k: v for k, v in env_vars.items() if v is not None})
    extra = ["-s", str(cwd / "beat-schedule")] if argv[-3:-1] == ["beat", "-l"] else []
    return subprocess.run(
        argv + extra, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=START_TIMEOUT_S,
    )  # fmt: skip


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    output = result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, output
    assert len(errors) == 1, output
    assert "Traceback" not in output, output
    assert " ready." not in output, output
    for fragment in fragments:
        assert fragment in errors[0], output
    return errors[0]


# -- the worker: every cause -------------------------------------------------------------------


def test_worker_without_a_database_url_refuses(agents_dir: Path, redis_url: str) -> None:
    result = start(WORKER, agents_dir, THREADS_BROKER_URL=redis_url, THREADS_AGENTS="scripted_agents")
    assert_refused(result, "worker cannot start", "THREADS_DATABASE_URL is not set")


def test_worker_with_an_unreachable_database_refuses_once_its_wait_is_over(agents_dir: Path, redis_url: str) -> None:
    result = start(
        WORKER, agents_dir, THREADS_DATABASE_URL=closed_port_url(), THREADS_BROKER_URL=redis_url,
        THREADS_AGENTS="scripted_agents", THREADS_DATABASE_STARTUP_WAIT_S="1",
    )  # fmt: skip
    line = assert_refused(result, "cannot reach the database", "(waited 1s)")
    assert "nothing_listens_here" in line
    assert "trying again in" in result.stderr  # it did wait, and said so


@pytest.mark.parametrize("argv", [WORKER, CLI_WORKER, BEAT], ids=["worker", "cli-worker", "beat"])
def test_a_database_that_does_not_exist_is_refused_without_waiting(
    argv: list[str], agents_dir: Path, pg_admin_url: str, redis_url: str
) -> None:
    """What no wait fixes is refused at once, however long the wait allowed (the run's timeout is shorter)."""
    missing = pg_admin_url.rsplit("/", 1)[0] + "/no_such_database_here"
    result = start(
        argv, agents_dir, THREADS_DATABASE_URL=missing, THREADS_BROKER_URL=redis_url,
        THREADS_AGENTS="scripted_agents", THREADS_DATABASE_STARTUP_WAIT_S=str(10 * START_TIMEOUT_S),
    )  # fmt: skip
    assert_refused(result, "cannot reach the database", "no_such_database_here", "does not exist")
    assert "trying again" not in result.stderr


def test_worker_on_an_unmigrated_database_refuses(agents_dir: Path, pg_url: str, redis_url: str) -> None:
    result = start(WORKER, agents_dir, THREADS_DATABASE_URL=pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="scripted_agents")  # fmt: skip
    assert_refused(result, "is at migration none", "threads-celery db upgrade")


def test_worker_whose_agent_module_fails_to_import_refuses(
    agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    result = start(WORKER, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="broken_agents")  # fmt: skip
    assert_refused(result, "cannot import agent module 'broken_agents'", "agent module exploded at import")


def test_worker_whose_agent_module_is_missing_refuses(agents_dir: Path, migrated_pg_url: str, redis_url: str) -> None:
    result = start(WORKER, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="no_such_agents")  # fmt: skip
    assert_refused(result, "cannot import agent module 'no_such_agents'")


def test_worker_without_the_model_providers_key_refuses(agents_dir: Path, migrated_pg_url: str, redis_url: str) -> None:
    pytest.importorskip("openai", reason="the openai extra is part of the test extra")
    result = start(WORKER, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="keyed_agents")  # fmt: skip
    assert_refused(result, "agent 'needs-key'", "openai:gpt-4o-mini", "OPENAI_API_KEY")


def test_worker_without_the_model_providers_package_refuses(
    agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    try:
        import anthropic  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - depends on what is installed
        pytest.skip("the anthropic package is installed here: no provider package is missing")
    (agents_dir / "anthropic_agents.py").write_text(
        "from threads_celery import Agent\n"
        "a = Agent(name='needs-package', instructions='x', model='anthropic:claude-3-5-haiku-latest')\n"
    )
    result = start(WORKER, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="anthropic_agents", ANTHROPIC_API_KEY="not-checked")  # fmt: skip
    assert_refused(result, "agent 'needs-package'", "anthropic", "pip install 'threads-celery[anthropic]'")


def test_the_celery_app_without_a_broker_url_refuses(agents_dir: Path) -> None:
    result = start(WORKER, agents_dir, THREADS_AGENTS="scripted_agents")
    assert_refused(result, "THREADS_BROKER_URL is not set")


# -- Beat, the CLI's services and the API --------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [BEAT, CLI_BEAT, CLI_WORKER, CLI_API], ids=["beat", "cli-beat", "cli-worker", "cli-api"]
)
def test_every_service_refuses_an_unmigrated_database(
    argv: list[str], agents_dir: Path, pg_url: str, redis_url: str
) -> None:
    result = start(argv, agents_dir, THREADS_DATABASE_URL=pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="scripted_agents")  # fmt: skip
    assert_refused(result, "is at migration none")


@pytest.mark.parametrize("argv", [BEAT, CLI_BEAT, CLI_API], ids=["beat", "cli-beat", "cli-api"])
def test_every_service_refuses_an_agent_module_that_fails_to_import(
    argv: list[str], agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    result = start(argv, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="broken_agents")  # fmt: skip
    assert_refused(result, "cannot import agent module 'broken_agents'")


@pytest.mark.parametrize("argv", [BEAT, CLI_API], ids=["beat", "cli-api"])
def test_every_service_refuses_a_missing_model_key(
    argv: list[str], agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    pytest.importorskip("openai", reason="the openai extra is part of the test extra")
    result = start(argv, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="keyed_agents")  # fmt: skip
    assert_refused(result, "OPENAI_API_KEY")


@pytest.mark.parametrize("argv", [BEAT, CLI_BEAT], ids=["beat", "cli-beat"])
def test_beat_refuses_an_unreachable_database(argv: list[str], agents_dir: Path, redis_url: str) -> None:
    result = start(argv, agents_dir, THREADS_DATABASE_URL=closed_port_url(), THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="scripted_agents", THREADS_DATABASE_STARTUP_WAIT_S="0")  # fmt: skip
    assert_refused(result, "cannot reach the database")


# -- a malformed THREADS_SECRET_KEY ----------------------------------------------------------------

#: Looks like a key and is one cut short: the refusal must not repeat it (it is half a secret).
CUT_KEY = "q3M0b0rZ8wYJr1l2cUu5x9Zp7KfE4nT6hA1sD3gLm"


@pytest.mark.parametrize(
    "argv", [WORKER, BEAT, CLI_WORKER, CLI_BEAT, CLI_API], ids=["worker", "beat", "cli-worker", "cli-beat", "cli-api"]
)
def test_every_service_refuses_a_malformed_secret_key(
    argv: list[str], agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    result = start(argv, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="scripted_agents", THREADS_SECRET_KEY=CUT_KEY)  # fmt: skip
    assert_refused(result, "THREADS_SECRET_KEY is not a valid Fernet key")
    assert CUT_KEY not in result.stdout + result.stderr
    assert CUT_KEY[:12] not in result.stdout + result.stderr


def test_the_embedded_run_refuses_a_malformed_secret_key(agents_dir: Path, tmp_path: Path) -> None:
    (agents_dir / "one_agent.py").write_text(AGENT_MODULES["scripted_agents"])
    argv = [sys.executable, "-m", "threads_celery.cli.app", "run", "one_agent:ok", "hi", "--db", str(tmp_path / "t.db")]
    result = start(argv, agents_dir, THREADS_SECRET_KEY=CUT_KEY)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "THREADS_SECRET_KEY is not a valid Fernet key" in output
    assert "Traceback" not in output and CUT_KEY not in output
    assert not (tmp_path / "t.db").exists(), "it started before refusing"


# -- the command line: a typo, a bypassed limit, no database, no extra ------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([*CLI_WORKER, "--concurency", "2"], "No such option '--concurency'. Did you mean '--concurrency'?"),
        ([*CLI_WORKER, "--autoscale", "abc"], "'--autoscale'"),
        ([*CLI_BEAT, "--bad"], "No such option '--bad'"),
    ],
    ids=["worker-typo", "worker-bad-value", "beat-typo"],
)
def test_an_option_celery_refuses_is_one_line(
    argv: list[str], fragment: str, agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    result = start(argv, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url,
                   THREADS_AGENTS="scripted_agents")  # fmt: skip
    line = assert_refused(result, fragment)
    assert line.startswith(f"error: {argv[3]} cannot start: "), line


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("THREADS_CELERY_TASK_TIME_LIMIT", "7200", "set THREADS_TASK_TIME_LIMIT_S instead"),
        ("THREADS_CELERY_BROKER_TRANSPORT_OPTIONS", '{"visibility_timeout": 60}', "set THREADS_VISIBILITY_TIMEOUT_S"),
    ],
    ids=["time-limit", "visibility-timeout"],
)
@pytest.mark.parametrize("argv", [WORKER, CLI_WORKER], ids=["worker", "cli-worker"])
def test_the_time_limit_cannot_be_set_around_its_check(
    argv: list[str], variable: str, value: str, fragment: str, agents_dir: Path, migrated_pg_url: str, redis_url: str
) -> None:
    env = {variable: value, "THREADS_AGENTS": "scripted_agents"}
    result = start(argv, agents_dir, THREADS_DATABASE_URL=migrated_pg_url, THREADS_BROKER_URL=redis_url, **env)
    assert_refused(result, fragment)


def test_the_api_without_a_database_refuses_unless_embedded(agents_dir: Path) -> None:
    line = assert_refused(start(CLI_API, agents_dir), "THREADS_DATABASE_URL and THREADS_BROKER_URL are not set")
    assert line.startswith("error: api cannot start: ") and "--embedded" in line, line
    assert not (agents_dir / ".threads-celery").exists(), "it opened the embedded store before refusing"


def test_the_api_does_not_migrate_a_sqlite_file_it_is_given(agents_dir: Path, redis_url: str) -> None:
    database = agents_dir / "given.db"
    result = start(CLI_API, agents_dir, THREADS_DATABASE_URL=f"sqlite:///{database}", THREADS_BROKER_URL=redis_url)
    assert_refused(result, "is at migration none", "threads-celery db upgrade")


def test_flower_without_its_extra_names_the_extra(agents_dir: Path, redis_url: str) -> None:
    # Flower's packages made unimportable, as in an environment installed without the extra.
    hide = "import sys; sys.modules.update(flower=None, tornado=None); sys.argv[0] = 'threads-celery'; "
    run_cli = "from threads_celery.cli.app import app; app()"
    argv = [sys.executable, "-c", hide + run_cli, "flower", "--port", "1"]
    result = start(argv, agents_dir, THREADS_BROKER_URL=redis_url, FLOWER_USER="u", FLOWER_PASSWORD="p")
    assert_refused(result, "pip install 'threads-celery[flower]'")
