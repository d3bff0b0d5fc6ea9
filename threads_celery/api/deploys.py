"""The HTTP API's deploy route: ``GET /v1/deploy``, each deployment version with its state, its
live workers, its unfinished runs by status and the runs stranded on it (what
``threads-celery deploy status --json`` prints), to callers of the default tenant."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from threads_celery.api.bodies import ErrorOut
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller
from threads_celery.records import DEFAULT_TENANT
from threads_celery.transitions.deploy_control import status_document

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads


class RampOut(BaseModel):
    """The version a share of new runs starts on."""

    version: str
    percent: int


class VersionOut(BaseModel):
    """One deployment version."""

    version: str
    state: str
    role: str | None
    ramp_percent: int
    workers: list[str]
    runs: dict[str, int]
    unfinished: int
    stranded: int
    pinned_reasons: dict[str, int]


class DeployOut(BaseModel):
    """Where new runs start, and every version that is not retired (or still has runs)."""

    current: str | None
    ramping: RampOut | None
    stranded: int
    versions: list[VersionOut]


def add_deploy_routes(router: APIRouter, threads: Threads, *, caller_of: Callable[..., Any]) -> None:
    """Add ``GET /deploy`` to ``router`` (the ``/v1`` router)."""

    @router.get(
        "/deploy",
        response_model=DeployOut,
        tags=["deploy"],
        responses={403: {"model": ErrorOut, "description": "The caller is not of the operators' tenant."}},
    )
    def deploy_status(caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        """Each deployment version: state, live workers, unfinished runs, stranded runs.

        The fleet's, across tenants: answered to callers of the default tenant (the operators';
        every caller of a single-tenant API), 403 to the others."""
        if caller.tenant != DEFAULT_TENANT:
            raise ApiError(
                403, "forbidden", "the deploy status is the operators': ask with a token of the default tenant"
            )
        return status_document(threads.store, threads.settings)
