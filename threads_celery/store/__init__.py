"""The ledger: its schema, its migrations and every query; nothing outside this package speaks SQL.

Of the package it imports only :mod:`threads_celery.records` (what its queries return) and
:mod:`threads_celery.exceptions`; ``pyproject.toml``'s import-linter contract keeps it so.
"""

from threads_celery.store.engine import create_store_engine, parse_database_url, safe_url
from threads_celery.store.repository import Store, Tx

__all__ = ["Store", "Tx", "create_store_engine", "parse_database_url", "safe_url"]
