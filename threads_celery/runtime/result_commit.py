"""An executed tool call's result commit: kept whole when it is long, retried through a store
outage while the call's lease holds, and told to the model when the store refuses it."""

from __future__ import annotations

import logging
import time

from threads_celery.decisions.retry import STORE_RECONNECT_BACKOFF
from threads_celery.definitions.tools import Tool, shorten_for_model
from threads_celery.exceptions import FenceLost, StoreUnavailable
from threads_celery.records import CallRow, Run
from threads_celery.redaction import describe_exception
from threads_celery.runtime.outcomes import commit_call
from threads_celery.runtime.ports import Worker

log = logging.getLogger("threads_celery.runtime.machine")  # the machine's log, as before the move

#: What the model is told when the tool ran but the store refused its result.
UNSTORED_RESULT = "the tool ran, but its result could not be stored"


def commit_executed(
    worker: Worker,
    run: Run,
    fence: int,
    call: CallRow,
    tool: Tool | None,
    content: str,
    *,
    is_error: bool,
    own_outbox: bool,
    fails_run: str | None = None,
    kind: str | None = None,
) -> str:
    """Commit an executed call's result, retrying while the store is unreachable.

    ``kind`` (see :class:`~threads_celery.records.ToolResult`) is dropped when the result is
    shown shortened: the text no longer stands for the whole value.

    Gives up (re-raising) after the tool lease, at least 5 s; the fence keeps a commit that
    arrives after another worker took the call over from being written.
    """
    # An output tool's successful result is the run's output, which the model never reads back
    # (it sees "Final result processed."), and files are given to the model as files, whole (as
    # Pydantic AI gives them): neither is cut.
    whole = (tool is not None and tool.gives_output and not is_error) or kind == "content"
    shortened = None if whole else shorten_for_model(content, worker.settings.max_tool_result_bytes)
    if shortened is not None:
        # Kept whole first (rewritten as it is if the call runs again), shown shortened.
        with worker.store.transaction() as tx:
            tx.keep_full_result(call.effect_key, content)
        content, kind = shortened, (None if kind == "json" else kind)
    deadline = time.monotonic() + max(worker.settings.tool_lease_s, 5.0)
    unreachable = 0
    while True:
        try:
            return commit_call(
                worker,
                run,
                fence,
                call,
                tool,
                content,
                is_error=is_error,
                own_outbox=own_outbox,
                fails_run=fails_run,
                kind=kind,
            )
        except StoreUnavailable as exc:
            unreachable += 1
            delay = STORE_RECONNECT_BACKOFF.delay_s(unreachable)
            if time.monotonic() + delay >= deadline:
                raise
            log.warning("call %s: cannot commit its result yet, retrying in %.1f s: %s", call.effect_key, delay, exc)
            time.sleep(delay)
        except FenceLost:
            raise
        except Exception as exc:  # the store refused this result: the model is told so, once
            if is_error and content.startswith(UNSTORED_RESULT):
                raise
            log.warning("call %s: its result could not be stored: %s", call.effect_key, describe_exception(exc, ()))
            content, is_error, kind = f"{UNSTORED_RESULT} ({describe_exception(exc, ())})", True, None
