"""The operations console: runs, a run's tree and timeline, the inbox, agents and the backbone.

``threads-celery api`` serves it at ``/console`` (``THREADS_CONSOLE=0`` turns it off); mount it
in your own FastAPI app with :func:`create_console`. See docs/console.md.
"""

from threads_celery.api.console.app import create_console
from threads_celery.api.console.pages import console_enabled

__all__ = ["console_enabled", "create_console"]
