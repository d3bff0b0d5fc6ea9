"""Running the shop project's commands and scripts from a test, on the test's database and broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.processes import REPO_ROOT, subprocess_env

PROJECT = Path(__file__).resolve().parent


def project_env(pg_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    """The environment of the shop project's processes: its database and broker, both the module's."""
    url = make_url(pg_url)
    return subprocess_env(
        {
            "PYTHONPATH": f"{REPO_ROOT}:{PROJECT}",
            "DJANGO_SETTINGS_MODULE": "proj.settings",
            "SHOP_DATABASE": str(url.database),
            "SHOP_DATABASE_HOST": str(url.host or "127.0.0.1"),
            "SHOP_DATABASE_PORT": str(url.port or 5432),
            "SHOP_DATABASE_USER": str(url.username or "postgres"),
            "SHOP_BROKER_URL": broker_url,
            **extra,
        }
    )


def manage(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` in the shop project, to its end."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def shop_script(env: dict[str, str], script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + script, *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def require_django() -> None:
    """Skip the module when Django is not installed (the django extra); fail it under CI, whose
    test extra brings Django, so that a broken install never passes as skipped tests."""
    import pytest

    from tests.support.services import in_ci

    try:
        import django  # noqa: F401 - only whether it imports
    except ImportError:
        message = "Django is not installed (pip install -e '.[django]')"
        if in_ci():
            pytest.fail(f"{message}; CI installs the test extra, which brings it", pytrace=False)
        pytest.skip(message, allow_module_level=True)
