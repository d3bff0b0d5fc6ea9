"""Bringing the ledger's tables up to date (its Alembic migrations), where the settings say it is."""

from __future__ import annotations

from threads_celery.contrib.django.configuration import threads_settings
from threads_celery.exceptions import ConfigError


def upgrade_ledger() -> str:
    """Apply every pending migration of the ledger; says what it did, naming the database."""
    from threads_celery.store.engine import create_store_engine, parse_database_url, safe_url
    from threads_celery.store.migrate import current_revision, upgrade

    settings = threads_settings()
    if settings.database_url is None:  # threads_settings() always names one
        raise ConfigError("no database for the ledger: set THREADS_DATABASE_URL")
    engine = create_store_engine(parse_database_url(settings.database_url, source="THREADS_DATABASE_URL"))
    try:
        before = current_revision(engine)
        upgrade(engine)
        after = current_revision(engine)
    finally:
        engine.dispose()
    where = safe_url(engine.url)
    return (
        f"at {after} on {where} (already)" if before == after else f"migrated {before or 'empty'} -> {after} on {where}"
    )


__all__ = ["upgrade_ledger"]
