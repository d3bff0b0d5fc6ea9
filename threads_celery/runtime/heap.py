"""Keeping a serving process's long-lived objects out of its garbage collections.

The modules a serving process imports (Pydantic AI, the providers' SDKs, Celery, kombu,
SQLAlchemy, FastAPI) and what its start-up builds on them are some 200,000 objects that live as
long as the process. A full collection walks every one of them while holding the GIL: on two busy
cores, 0.2-0.9 s in which no stream is written to and no live delta is published (each step's
allocations bring the next full collection closer). :func:`gc.freeze` moves them into a
generation that is never walked again; what is made afterwards is collected as before.

The HTTP API settles its heap once its app is built. A worker settles it at ``worker_init``,
before a prefork pool forks (the children then share the frozen pages instead of copying them as
the collector touches them), and each pool process again once its own start-up is done.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Freeze what exists now, after one collection of the start-up's own garbage."""
    gc.collect()  # the start-up's own garbage goes first, so that none of it is kept for good
    gc.freeze()


__all__ = ["settle_heap"]
