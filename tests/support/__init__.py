"""Shared helpers for the threads-celery test suite (not shipped with the package)."""
