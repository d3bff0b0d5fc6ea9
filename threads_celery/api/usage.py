"""The HTTP API's usage routes: model usage per run, per thread and per agent per UTC day, and
Prometheus metrics (``GET /v1/metrics``, behind the same bearer token).

``GET /v1/runs/{id}/usage``, ``GET /v1/threads/{id}/usage`` and ``GET /v1/usage?agent=&day=``
answer :class:`UsageOut`: requests, input, output and total tokens, and cost (null when no call
had a price in ``THREADS_MODEL_PRICES``). An unknown run or thread, or one of another tenant, is a
404; ``/v1/usage`` sums the caller's tenant only.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import BaseModel, Field

from threads_celery.api.bodies import ID_PATTERN, ErrorOut, RunOut, _Request
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller, owned_run, owned_thread, shown_to
from threads_celery.decisions.usage import named_day
from threads_celery.telemetry.metrics import render

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.records import UsageTotals


class AllowUsage(_Request):
    """Lets a run parked at a usage limit go on (recorded under the bearer token's principal)."""

    principal: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=255,
            description="Ignored: the allowance is recorded under the bearer token's principal.",
        ),
    ] = None


class UsageOut(BaseModel):
    """Summed model usage."""

    requests: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost: float | None = None

    @classmethod
    def of(cls, totals: UsageTotals) -> UsageOut:
        return cls(
            requests=totals.requests,
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            total_tokens=totals.total_tokens,
            cost=totals.cost,
        )


def add_usage_routes(router: APIRouter, threads: Threads, *, caller_of: Callable[..., Caller]) -> None:
    """Register the usage routes on the /v1 router."""
    not_found: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "No such run or thread."}}

    @router.get("/runs/{run_id}/usage", response_model=UsageOut, tags=["usage"], responses=not_found)
    def run_usage(run_id: Annotated[str, Path(pattern=ID_PATTERN)], caller: Caller = Depends(caller_of)) -> UsageOut:
        """The run's model usage so far."""
        return UsageOut.of(threads.usage(run_id=owned_run(threads, caller, run_id)))  # RunNotFound: 404

    @router.post(
        "/runs/{run_id}/allow-usage",
        response_model=RunOut,
        tags=["usage"],
        responses={**not_found, 409: {"model": ErrorOut, "description": "The run is not parked at a usage limit."}},
    )
    def allow_usage(
        run_id: Annotated[str, Path(pattern=ID_PATTERN)],
        body: AllowUsage,
        caller: Caller = Depends(caller_of),
    ) -> RunOut:
        """Let a run parked at a usage limit (on_limit="ask") go on; its usage counts again from now."""
        stored = owned_run(threads, caller, run_id)  # RunNotFound: 404
        return RunOut.of(threads.allow_usage(stored, principal=caller.principal), shown_to(caller))

    @router.get("/threads/{thread_id}/usage", response_model=UsageOut, tags=["usage"], responses=not_found)
    def thread_usage(
        thread_id: Annotated[str, Path(pattern=ID_PATTERN)], caller: Caller = Depends(caller_of)
    ) -> UsageOut:
        """The thread's model usage over all its runs."""
        return UsageOut.of(threads.usage(thread_id=owned_thread(threads, caller, thread_id)))  # ThreadNotFound: 404

    @router.get(
        "/metrics",
        tags=["usage"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
    )
    def metrics() -> Response:
        """Prometheus metrics: runs by status, waiting calls and runs, outbox depth, reconcile lag
        (from the ledger), and the latencies this process observed (see threads_celery.telemetry.metrics)."""
        try:
            body, content_type = render(threads.store)
        except ImportError:
            return Response("prometheus-client is not installed: pip install 'threads-celery[metrics]'\n", 501)
        return Response(body, media_type=content_type)

    @router.get("/usage", response_model=UsageOut, tags=["usage"])
    def usage(
        agent: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        day: Annotated[
            str | None,
            Query(
                pattern=r"^(today|\d{4}-\d{2}-\d{2})$",
                description="A UTC day, YYYY-MM-DD, or 'today' (as the CLI's --day).",
                examples=["2026-12-03", "today"],
            ),
        ] = None,
        caller: Caller = Depends(caller_of),
    ) -> UsageOut:
        """The caller's tenant's model usage of an agent, a UTC day, or both (all of it when neither is given)."""
        try:
            on_day = None if day is None else named_day(day, now=datetime.now(UTC))
        except ValueError:
            raise ApiError(422, "validation_error", f"day must be YYYY-MM-DD or 'today', not {day!r}") from None
        return UsageOut.of(threads.usage(agent=agent, day=on_day, tenant=caller.tenant))


__all__ = ["UsageOut", "add_usage_routes"]
