"""What a web app or script holds: :class:`Threads`, the runtime handle.

It imports neither the model layer nor any tool code (``tests/unit/client/test_client_imports.py``).
"""

from threads_celery.client.threads import Threads

__all__ = ["Threads"]
