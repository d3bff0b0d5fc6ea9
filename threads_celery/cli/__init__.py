"""The ``threads-celery`` command line (Typer)."""
