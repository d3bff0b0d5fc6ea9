"""No Django models: the ledger's tables are the runtime's own, migrated by its own migrations.

This module exists so that Django sends this app its ``post_migrate`` signal (it skips apps
without a models module), on which ``manage.py migrate`` brings the ledger up to date.
"""
