"""The HTTP API's deploy route: ``GET /v1/deploy``, each deployment version with its state, its
live workers, its unfinished runs by status and the runs stranded on it (what
``threads-celery deploy status --json`` prints), and ``POST /v1/deploy/upgrade``, which asks a
version's workers to move another version's runs (what ``threads-celery runs upgrade`` does);
both to callers of the default tenant only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from threads_celery.api.bodies import ErrorOut, _Request
from threads_celery.api.errors import ApiError
from threads_celery.api.tenancy import Caller
from threads_celery.exceptions import DeployRefused
from threads_celery.records import DEFAULT_TENANT
from threads_celery.transitions.deploy_control import send_upgrades, status_document

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


class UpgradeRuns(_Request):
    """Move the unfinished runs of one version to another, each after the compatibility check."""

    from_version: Annotated[str, Field(alias="from", min_length=1, max_length=64)]
    to_version: Annotated[str, Field(alias="to", min_length=1, max_length=64)]


class UpgradeSentOut(BaseModel):
    """The runs whose check was sent to the target version's workers."""

    to: str
    runs: list[str]


def _operator(caller: Caller) -> None:
    if caller.tenant != DEFAULT_TENANT:
        raise ApiError(403, "forbidden", "deploys are the operators': ask with a token of the default tenant")


def add_deploy_routes(router: APIRouter, threads: Threads, *, caller_of: Callable[..., Any]) -> None:
    """Add ``GET /deploy`` and ``POST /deploy/upgrade`` to ``router`` (the ``/v1`` router)."""

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
        _operator(caller)
        return status_document(threads.store, threads.settings)

    @router.post(
        "/deploy/upgrade",
        response_model=UpgradeSentOut,
        status_code=202,
        tags=["deploy"],
        responses={
            403: {"model": ErrorOut, "description": "The caller is not of the operators' tenant."},
            409: {"model": ErrorOut, "description": "The target version is unknown, retired or has no live worker."},
        },
    )
    def upgrade_runs(body: UpgradeRuns, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        """Ask the target version's workers to check each unfinished run of ``from`` and move it,
        or pin it with the reason (see each run's ``deploy_*`` fields and ``GET /v1/deploy``).
        ``threads-celery runs upgrade --dry-run`` shows the outcome beforehand."""
        _operator(caller)
        try:
            sent = send_upgrades(threads.store, threads.publisher, body.from_version, body.to_version)
        except DeployRefused as exc:
            raise ApiError(409, "conflict", exc.message) from None
        return {"to": body.to_version, "runs": sent}
