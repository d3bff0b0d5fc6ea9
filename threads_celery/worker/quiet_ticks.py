"""The backbone's ticks, quiet in the worker's log unless they did something.

Beat sends a reconcile tick every few seconds; Celery logs each one's receipt and success at
INFO, which buries the agents' work. :class:`QuietTicks` lowers those two lines to DEBUG (shown
with ``--loglevel DEBUG``), except the success line of a tick that re-dispatched or republished
anything, which stays at INFO. Warnings and errors of a tick are never touched.
"""

from __future__ import annotations

import logging
import re

from threads_celery.decisions.backbone import RECONCILE_TASK

#: Celery's loggers of "Task ... received" and "Task ... succeeded in ...".
CELERY_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")
_A_COUNT_ABOVE_ZERO = re.compile(r":\s*[1-9]")


class QuietTicks(logging.Filter):
    """Lowers a reconcile tick's receipt, and its success when it found nothing to do, to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if record.levelno != logging.INFO or not isinstance(data, dict) or data.get("name") != RECONCILE_TASK:
            return True
        if "return_value" in data and _A_COUNT_ABOVE_ZERO.search(str(data["return_value"])):
            return True  # the tick re-dispatched or republished something: worth a line
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        # Handlers compare the record's level with theirs; the logger's own check already passed.
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install() -> None:
    """Add :class:`QuietTicks` to Celery's task loggers in this process (and the pool processes
    it forks); idempotent."""
    for name in CELERY_TASK_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietTicks) for f in logger.filters):
            logger.addFilter(QuietTicks())
