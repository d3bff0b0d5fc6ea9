"""The CI entry point (.ci/run) does what the project documents."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CI_SCRIPT = REPO_ROOT / ".ci" / "run"
README = REPO_ROOT / "README.md"

TEST_COMMAND = "CI=true .venv/bin/python -m pytest -q"
PG_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
REDIS_START = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no '
    "--dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


def _code_lines() -> list[str]:
    """Lines of .ci/run with comments and blank lines removed."""
    lines = []
    for raw in CI_SCRIPT.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _code() -> str:
    return "\n".join(_code_lines())


def test_ci_script_exists_and_is_executable() -> None:
    assert CI_SCRIPT.is_file()
    mode = CI_SCRIPT.stat().st_mode
    assert mode & stat.S_IXUSR, ".ci/run must be executable (chmod +x .ci/run)"
    assert os.access(CI_SCRIPT, os.X_OK)


def test_ci_script_is_strict_bash() -> None:
    text = CI_SCRIPT.read_text()
    assert text.splitlines()[0] in {"#!/usr/bin/env bash", "#!/bin/bash"}
    assert "set -euo pipefail" in _code_lines()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_ci_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(CI_SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ci_script_runs_the_documented_test_command_with_ci_set() -> None:
    code = _code()
    assert "export CI=true" in code
    assert "python -m pytest" in code
    assert TEST_COMMAND in code


def test_ci_script_installs_the_test_extra_into_a_venv() -> None:
    code = _code()
    assert "-m venv .venv" in code
    assert re.search(r"pip install .*-e '\.\[test\]'", code)


def test_ci_script_checks_and_starts_postgresql() -> None:
    code = _code()
    assert "pg_isready" in code and "-h 127.0.0.1 -p 5432" in code
    assert PG_START in code


def test_ci_script_checks_and_starts_redis() -> None:
    code = _code()
    assert "redis-cli -h 127.0.0.1" in code and "ping" in code
    assert REDIS_START in code


def test_ci_script_turns_no_tests_collected_into_a_failure() -> None:
    code = _code()
    match = re.search(r"^5\)(.*?);;", code, flags=re.MULTILINE | re.DOTALL)
    assert match, "pytest exit code 5 must be handled explicitly"
    assert "no tests ran" in match.group(1)
    assert "rc=1" in match.group(1)


def _readme_test_commands() -> list[str]:
    """Shell lines mentioning pytest inside code blocks of README's "Run the tests" section."""
    text = README.read_text()
    heading = re.search(r"^(#+)\s*Run the tests\b.*$", text, flags=re.MULTILINE | re.IGNORECASE)
    if heading is None:
        return []
    level = len(heading.group(1))
    rest = text[heading.end() :]
    next_heading = re.search(rf"^#{{1,{level}}}\s", rest, flags=re.MULTILINE)
    section = rest[: next_heading.start()] if next_heading else rest
    commands = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", section, flags=re.DOTALL):
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ").strip()
            if "pytest" in line and not line.startswith("#"):
                # The setup steps before `&&` are .ci/run's own; the test command must match.
                commands.append(next(part.strip() for part in line.split("&&") if "pytest" in part))
    return commands


def test_ci_script_matches_readme_when_present() -> None:
    if not README.exists():
        pytest.skip("README.md not written yet")
    commands = _readme_test_commands()
    if not commands:
        pytest.skip('README.md has no "Run the tests" section with a pytest command yet')
    code = _code()
    for command in commands:
        assert command in code, f"README's test command {command!r} is not what .ci/run runs"


def test_ci_script_lints_the_package_before_the_tests_and_fails_on_findings() -> None:
    code = _code()
    assert "LINT_PATHS=(threads_celery tasks beat)" in code
    assert 'RUFF_PATHS=("${LINT_PATHS[@]}" tests bench examples)' in code, "tests, bench and examples are linted too"
    assert '-m ruff check "${RUFF_PATHS[@]}"' in code
    assert '-m mypy --strict "${LINT_PATHS[@]}"' in code
    assert code.index("-m mypy --strict") < code.index(TEST_COMMAND), "lint runs before the tests"
    lint = code[code.index('phase "lint"') : code.index('phase "browser"')]
    assert "die " in lint, "a lint finding must fail the run"
    assert '-m ruff format --check "${RUFF_PATHS[@]}"' in code, "formatting is checked too"
    assert "lint-imports ||" in lint, "the import contracts are checked too"


def test_ci_script_builds_the_docs_strictly_after_lint_and_before_the_tests() -> None:
    code = _code()
    assert re.search(r"pip install .*-e '\.\[docs\]'", code), "the docs extra is installed"
    build = '-m mkdocs build --strict --site-dir "${DOCS_SITE_DIR}"'
    assert build in code
    assert code.index('phase "lint"') < code.index(build) < code.index(TEST_COMMAND)
    docs = code[code.index('phase "docs"') : code.index('phase "browser"')]
    assert "mktemp -d" in docs and 'rm -rf "${DOCS_SITE_DIR}"' in docs, "the site is built outside the repository"
    assert "die " in docs, "a docs build failure must fail the run"


def test_the_built_site_is_never_committed() -> None:
    ignored = (REPO_ROOT / ".gitignore").read_text().splitlines()
    assert "site/" in ignored or "/site/" in ignored
    assert (REPO_ROOT / "mkdocs.yml").is_file()
