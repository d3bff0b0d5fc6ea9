"""The ledger: schema, migrations and the one module that speaks SQL."""

from threads_celery.store.engine import create_store_engine, parse_database_url, safe_url
from threads_celery.store.repository import Store, Tx

__all__ = ["Store", "Tx", "create_store_engine", "parse_database_url", "safe_url"]
