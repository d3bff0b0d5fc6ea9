"""What an operator does to deployment versions: read their status, make one current, ramp one,
roll back, retire one. Shared by ``threads-celery deploy``, the HTTP API and the console.

Each command is one transaction and takes effect for new runs at once: a run's first step reads
where new runs go when it is taken (:func:`threads_celery.runtime.deploys.route_step`). Runs
already placed stay where they are (pinned), or move by upgrade.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from threads_celery.decisions.deploys import VersionStatus, check_version_name, retire_refusal, version_statuses
from threads_celery.exceptions import DeployRefused
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.store import Store
from threads_celery.transitions.runs import utcnow
from threads_celery.transitions.upgrades import upgrade_entry

#: Sends task messages after commit (the client's or a worker's publisher).
Publish = Callable[[Sequence[OutboxEntry]], None]


def deploy_status(store: Store, settings: Settings | None = None) -> list[VersionStatus]:
    """Each version with its live workers, its unfinished runs by status, its state, and how
    many of its runs are stranded (no live worker within ``THREADS_DEPLOY_LIVENESS_S``)."""
    settings = settings or Settings()
    with store.read() as tx:
        versions = tx.deploy_versions()
        workers = tx.deploy_workers_seen()
        unfinished = tx.unfinished_by_version()
        reasons = tx.pinned_reasons_by_version()
    return version_statuses(
        versions,
        workers,
        unfinished,
        now=utcnow(),
        liveness=timedelta(seconds=settings.deploy_liveness_s),
        pinned_reasons=reasons,
    )


def status_document(store: Store, settings: Settings | None = None) -> dict[str, Any]:
    """:func:`deploy_status` as JSON data: what ``deploy status --json`` and ``GET /v1/deploy`` answer."""
    statuses = deploy_status(store, settings)
    current = next((s.version for s in statuses if s.role == "current"), None)
    ramping = next((s for s in statuses if s.role == "ramping"), None)
    return {
        "current": current,
        "ramping": None if ramping is None else {"version": ramping.version, "percent": ramping.ramp_percent},
        "stranded": sum(s.stranded for s in statuses),
        "versions": [s.as_dict() for s in statuses if s.state != "retired" or s.unfinished],
    }


def _known(store: Store, version: str) -> None:
    refused = check_version_name(version)
    if refused is not None:
        raise DeployRefused(refused)
    with store.read() as tx:
        row = tx.deploy_version(version)
    if row is None:
        raise DeployRefused(f"no worker of version {version!r} ever registered; start one first")
    if row.retired_at is not None:
        raise DeployRefused(f"version {version!r} is retired")


def set_current(store: Store, version: str) -> None:
    """New runs start on ``version`` from now on."""
    _known(store, version)
    with store.transaction() as tx:
        tx.set_current_version(version, utcnow())


def set_ramping(store: Store, version: str, percent: int) -> None:
    """Send ``percent`` (1-100) of new runs to ``version``; 0 ends the ramp."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise DeployRefused(f"a ramp is a whole percentage from 0 to 100, not {percent!r}")
    _known(store, version)
    with store.transaction() as tx:
        current, _, _ = tx.placement()
        if version == current:
            raise DeployRefused(f"version {version!r} is current already")
        tx.set_ramping_version(version if percent else None, percent)


def rollback(store: Store) -> str:
    """End any ramp and make the version that was current before the current one current again;
    the version rolled back to."""
    with store.transaction() as tx:
        versions = tx.deploy_versions()
        current = next((v for v in versions if v.role == "current"), None)
        earlier = [
            v
            for v in versions
            if v.role != "current" and v.promoted_at is not None and v.retired_at is None
            and (current is None or current.promoted_at is None or v.promoted_at <= current.promoted_at)
        ]  # fmt: skip
        tx.set_ramping_version(None, 0)
        if not earlier:
            if any(v.role == "ramping" for v in versions):
                return current.version if current else ""
            raise DeployRefused("no version was current before this one: nothing to roll back to")
        previous = max(earlier, key=lambda v: v.promoted_at or utcnow())
        tx.set_current_version(previous.version, utcnow())
        return previous.version


def retire(store: Store, version: str) -> None:
    """Retire ``version``: refused while it is current or an unfinished run is pinned to it."""
    _known(store, version)
    with store.transaction() as tx:
        row = tx.deploy_version(version)
        unfinished = sum(count for v, _, count in tx.unfinished_by_version() if v == version)
        refused = retire_refusal(version, row.role if row else None, unfinished)
        if refused is not None:
            raise DeployRefused(refused)
        tx.retire_version(version, utcnow())


def send_upgrades(
    store: Store, publish: Publish, from_version: str, to_version: str, *, limit: int = 10_000
) -> list[str]:
    """Ask the workers of ``to_version`` to check each unfinished run of ``from_version`` and move
    it there, or pin it with the reason (what ``runs upgrade`` does in process, done by the target's
    own workers): the ids of the runs asked about. Refused unless ``to_version`` has a live worker."""
    if from_version == to_version:
        raise DeployRefused("the two versions are the same")
    for version in (from_version, to_version):
        refused = check_version_name(version)
        if refused is not None:
            raise DeployRefused(refused)
    _known(store, to_version)
    live = {s.version for s in deploy_status(store) if s.workers}
    if to_version not in live:
        raise DeployRefused(f"version {to_version!r} has no live worker to check the runs")
    with store.read() as tx:
        run_ids = [run.id for run in tx.runs_on_version(from_version, limit=limit)]
    publish([upgrade_entry(run_id, to_version) for run_id in run_ids])
    return run_ids
