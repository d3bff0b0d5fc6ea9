"""``celery -A beat beat`` from the repository root (and in the image): the same app as :mod:`tasks`.

The app is :data:`threads_celery.worker.app`, built when first asked for; installed users name it
by the package (``celery -A threads_celery.worker beat``). What Beat publishes, the reconcile
backbone and the scheduled batch agents, is described in :mod:`threads_celery.worker.beat`. This
directory is not installed into site-packages, where a top-level ``beat`` would shadow a user's own.
"""

from typing import Any

import threads_celery.worker

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    # Asked for, not imported: threads_celery.worker builds its app on first access, so importing
    # ``beat`` needs no configured environment.
    if name == "app":
        return threads_celery.worker.app
    raise AttributeError(f"module 'beat' has no attribute {name!r}")
