"""``?prepare_threshold=`` in the database URL: psycopg's prepared statements, for poolers."""

from __future__ import annotations

import pytest

from threads_celery.exceptions import ConfigError
from threads_celery.store import create_store_engine, parse_database_url


def _threshold(url: str) -> int | None:
    engine = create_store_engine(parse_database_url(url))
    try:
        with engine.connect() as conn:
            assert "prepare_threshold" not in conn.engine.url.query  # never sent to the server
            return conn.connection.dbapi_connection.prepare_threshold  # type: ignore[union-attr]
    finally:
        engine.dispose()


def test_prepared_statements_stay_on_by_default_and_turn_off_for_a_pooler(pg_url: str) -> None:
    assert _threshold(pg_url) == 5
    assert _threshold(f"{pg_url}?prepare_threshold=none") is None
    assert _threshold(f"{pg_url}?prepare_threshold=0") == 0


@pytest.mark.parametrize("value", ["sometimes", "-1"])
def test_a_bad_prepare_threshold_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="prepare_threshold"):
        create_store_engine(parse_database_url(f"postgresql://u@127.0.0.1:1/db?prepare_threshold={value}"))
