"""``celery -A tasks worker`` and ``celery -A tasks beat`` from the repository root (and in the image).

The app is :data:`threads_celery.worker.app`, configured from ``THREADS_*`` variables; installed
users name it by the package: ``celery -A threads_celery.worker worker``. This directory is not
installed into site-packages, where a top-level ``tasks`` would shadow a user's own.
"""

from threads_celery.worker import app

__all__ = ["app"]
