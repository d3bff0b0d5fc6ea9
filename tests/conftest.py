"""Root test configuration for threads-celery.

Fixtures provided here (all usable from any test module):

* ``pg_admin_url`` (session) -> ``str``: SQLAlchemy URL of the ``postgres`` maintenance
  database on the test server; skips locally / fails under CI when unreachable.
* ``pg_url`` (function) -> ``str``: SQLAlchemy URL of a brand-new, empty database
  ``tc_test_<hex>``, dropped (``WITH (FORCE)``) after the test.
* ``pg_url_module`` (module) -> ``str``: the same, shared by all tests of one module.
* ``redis_url`` (session) -> ``str``: ``redis://127.0.0.1:6379/<n>``, a DB flushed at session start.
* ``allow_model_requests`` (function): lets pydantic-ai make model requests for one test
  (meant for tests talking to ``tests.support.fake_openai.FakeOpenAI``).

Environment knobs: ``THREADS_TEST_PG_HOST`` / ``THREADS_TEST_PG_PORT`` / ``THREADS_TEST_PG_USER``,
``THREADS_TEST_REDIS_HOST`` / ``THREADS_TEST_REDIS_PORT`` / ``THREADS_TEST_REDIS_DB`` (1..15, default 9),
and ``CI`` (``true``/``1``: unreachable services fail tests instead of skipping them).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent

# Make ``tests.support`` importable however pytest was launched (``python -m pytest``
# already has the repo root on sys.path; a bare ``pytest`` executable does not).
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

# Re-exported here so the helper is available as conftest.require_service too.
from tests.support.services import in_ci, require_service  # noqa: E402, F401

pytest_plugins = ("celery.contrib.pytest",)


# --------------------------------------------------------------------------- markers

_DIRECTORY_MARKERS = {
    "integration": "integration",
    "chaos": "integration",
    "acceptance": "acceptance",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under tests/integration and tests/chaos are ``integration``; tests/acceptance are ``acceptance``."""
    for item in items:
        try:
            relative = Path(item.path).resolve().relative_to(TESTS_DIR)
        except ValueError:
            continue
        marker = _DIRECTORY_MARKERS.get(relative.parts[0]) if len(relative.parts) > 1 else None
        if marker is not None and item.get_closest_marker(marker) is None:
            item.add_marker(getattr(pytest.mark, marker))


# --------------------------------------------------------------- no real model calls

_PROVIDER_KEY_VARS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "CO_API_KEY",
    "COHERE_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "XAI_API_KEY",
    "CEREBRAS_API_KEY",
    "HF_TOKEN",
)
DUMMY_API_KEY = "test-dummy-key-not-a-real-credential"


def _set_allow_model_requests(value: bool) -> bool | None:
    """Set ``pydantic_ai.models.ALLOW_MODEL_REQUESTS``; return the previous value (None if pydantic-ai is absent)."""
    try:
        import pydantic_ai.models as models
    except ImportError:
        return None
    previous = bool(models.ALLOW_MODEL_REQUESTS)
    models.ALLOW_MODEL_REQUESTS = value
    return previous


def pytest_configure(config: pytest.Config) -> None:
    # Provider SDKs refuse to start without a key; give them a dummy one (inherited by any
    # subprocess a test starts) rather than letting a developer's real key be picked up
    # implicitly. A key that is already set is left alone.
    for var in _PROVIDER_KEY_VARS:
        if not os.environ.get(var):
            os.environ[var] = DUMMY_API_KEY


def pytest_sessionstart(session: pytest.Session) -> None:
    _set_allow_model_requests(False)


@pytest.fixture(autouse=True)
def _forbid_model_requests() -> None:
    """Every test starts with pydantic-ai model requests forbidden (undoes leaks from earlier tests)."""
    if "pydantic_ai.models" in sys.modules:
        sys.modules["pydantic_ai.models"].ALLOW_MODEL_REQUESTS = False


@pytest.fixture
def allow_model_requests() -> Iterator[None]:
    """Allow pydantic-ai model requests for this test only (point the model at FakeOpenAI!)."""
    previous = _set_allow_model_requests(True)
    if previous is None:
        pytest.skip("pydantic-ai is not installed")
    try:
        yield
    finally:
        _set_allow_model_requests(previous)


# ------------------------------------------------------------------------ PostgreSQL


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str

    @classmethod
    def from_env(cls) -> PgServer:
        return cls(
            host=os.environ.get("THREADS_TEST_PG_HOST", "127.0.0.1"),
            port=int(os.environ.get("THREADS_TEST_PG_PORT", "5432")),
            user=os.environ.get("THREADS_TEST_PG_USER", "postgres"),
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def sqlalchemy_url(self, database: str) -> str:
        return f"postgresql+psycopg://{quote(self.user, safe='')}@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres", **kwargs: object):  # -> psycopg.Connection
        import psycopg

        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname=database, connect_timeout=3, **kwargs
        )


def _describe(exc: BaseException) -> str:
    """One-line description of a connection error (psycopg messages span several lines)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


@pytest.fixture(scope="session")
def pg_server() -> PgServer:
    return PgServer.from_env()


@pytest.fixture(scope="session")
def pg_admin_url(pg_server: PgServer) -> str:
    """SQLAlchemy URL of the maintenance database; the server is checked reachable first."""
    try:
        with pg_server.connect() as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - psycopg.OperationalError and friends: any failure means unreachable
        require_service("PostgreSQL", False, _describe(exc), address=pg_server.address)
    return pg_server.sqlalchemy_url("postgres")


@contextmanager
def _fresh_database(pg_server: PgServer) -> Iterator[str]:
    from psycopg import sql

    name = f"tc_test_{uuid.uuid4().hex[:16]}"
    with pg_server.connect(autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    try:
        yield pg_server.sqlalchemy_url(name)
    finally:
        with pg_server.connect(autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def pg_url(pg_admin_url: str, pg_server: PgServer) -> Iterator[str]:
    """A fresh empty database for this test, dropped afterwards."""
    with _fresh_database(pg_server) as url:
        yield url


@pytest.fixture(scope="module")
def pg_url_module(pg_admin_url: str, pg_server: PgServer) -> Iterator[str]:
    """A fresh empty database shared by the tests of one module, dropped afterwards."""
    with _fresh_database(pg_server) as url:
        yield url


# ----------------------------------------------------------------------------- Redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``redis://HOST:PORT/<n>`` with n from THREADS_TEST_REDIS_DB (1..15, default 9), flushed at session start."""
    import redis

    host = os.environ.get("THREADS_TEST_REDIS_HOST", "127.0.0.1")
    port = int(os.environ.get("THREADS_TEST_REDIS_PORT", "6379"))
    raw_db = os.environ.get("THREADS_TEST_REDIS_DB", "9")
    try:
        db = int(raw_db)
    except ValueError:
        db = -1
    if not 1 <= db <= 15:
        pytest.fail(f"THREADS_TEST_REDIS_DB must be an integer in 1..15 (DB 0 is never flushed), got {raw_db!r}")

    client = redis.Redis(host=host, port=port, db=db, socket_timeout=2, socket_connect_timeout=2)
    try:
        try:
            client.ping()
        except redis.RedisError as exc:
            require_service("Redis", False, _describe(exc), address=f"{host}:{port}")
        client.flushdb()
    finally:
        client.close()
    yield f"redis://{host}:{port}/{db}"
