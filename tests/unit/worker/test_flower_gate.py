"""The Flower launcher's checks: no empty or ambiguous credentials, and /metrics behind them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from threads_celery.exceptions import ConfigError
from threads_celery.worker.flower_gate import flower_argv, flower_credentials, require_auth_on_metrics


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"FLOWER_USER": "admin"},
        {"FLOWER_PASSWORD": "pw"},
        {"FLOWER_USER": "", "FLOWER_PASSWORD": ""},
        {"FLOWER_USER": "admin", "FLOWER_PASSWORD": "   "},
    ],
)
def test_empty_or_missing_credentials_are_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="FLOWER_USER and FLOWER_PASSWORD"):
        flower_credentials(environ)


@pytest.mark.parametrize(
    ("environ", "word"),
    [
        ({"FLOWER_USER": "ad:min", "FLOWER_PASSWORD": "pw"}, "':'"),
        ({"FLOWER_USER": "admin", "FLOWER_PASSWORD": "a,b"}, "','"),
        (
            {"FLOWER_USER": "admin", "FLOWER_PASSWORD": "pw", "FLOWER_UNAUTHENTICATED_API": "true"},
            "FLOWER_UNAUTHENTICATED_API",
        ),
        ({"FLOWER_USER": "admin", "FLOWER_PASSWORD": "pw", "FLOWER_BASIC_AUTH": ":"}, "FLOWER_BASIC_AUTH"),
    ],
)
def test_credentials_flower_would_read_differently_are_refused(environ: dict[str, str], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        flower_credentials(environ)


def test_good_credentials_become_the_basic_auth_option() -> None:
    credentials = flower_credentials({"FLOWER_USER": "admin", "FLOWER_PASSWORD": "s3cret!"})
    assert flower_argv(credentials, address="127.0.0.1", port=5555) == [
        "flower", "--address=127.0.0.1", "--port=5555", "--basic-auth=admin:s3cret!",
    ]  # fmt: skip


def test_metrics_route_is_replaced_by_an_authenticated_handler() -> None:
    pytest.importorskip("flower")
    from flower import app as flower_app
    from flower import urls
    from flower.views.monitor import Metrics

    require_auth_on_metrics()
    require_auth_on_metrics()  # idempotent
    [handler] = [route[1] for route in urls.handlers if isinstance(route, tuple) and route[0] == r"/metrics"]
    assert handler is not Metrics and issubclass(handler, Metrics)
    assert flower_app.default_handlers is urls.handlers  # the list Flower builds its application from


def test_the_cli_refuses_to_start_flower_without_credentials() -> None:
    env = {"PATH": "/usr/bin:/bin", "THREADS_BROKER_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "threads-celery"), "flower"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refusing to start Flower without credentials" in done.stdout + done.stderr
