"""Fixtures of the fleet tests: a fleet of network namespaces per test, torn down whatever happens.

Where namespaces cannot be made (not root, no iproute2 or iptables) the tests skip, saying why.
Under ``CI=true`` they fail instead only when namespaces should work: the process is root and
``ip`` and ``iptables`` are installed (as ``.ci/run`` makes sure), yet making a namespace or a rule
in one fails. An unprivileged CI runner, which cannot make namespaces at all, skips.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.cluster import HOSTS, Fleet, postgres_user_exists
from tests.fleet.network import Network, namespaces_problem, remove_stale
from tests.support.private_rabbitmq import PrivateRabbitMQ
from tests.support.processes import PG_BIN, exit_cleanly_on_sigterm
from tests.support.services import in_ci, require_service


def _should_work() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("iptables") is not None


def _missing() -> str | None:
    problem = namespaces_problem()
    if problem:
        return problem
    for tool in ("pgbouncer", "redis-server"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install pgbouncer redis-server)"
    if not (PG_BIN / "initdb").exists():
        return f"{PG_BIN / 'initdb'} not found (set THREADS_TEST_PG_BIN)"
    if not postgres_user_exists():
        return "there is no 'postgres' user to run PostgreSQL and PgBouncer as"
    return None


@pytest.fixture(scope="session")
def fleet_ready() -> None:
    problem = _missing()
    if problem is None:
        exit_cleanly_on_sigterm()
        remove_stale()
        return
    message = f"the fleet tests need network namespaces: {problem}"
    if in_ci() and _should_work():
        pytest.fail(f"{message} (CI is set and this runs as root with ip and iptables: they should work)")
    pytest.skip(message)


@pytest.fixture
def fleet(fleet_ready: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """A started fleet (PostgreSQL, PgBouncer, the broker; no workers yet) on namespaces of its own;
    w3 reaches the ledger through a delay proxy (no delay until a test sets one). The broker is
    Redis, or the ``request.param`` of an indirect parametrization (``rabbitmq``)."""
    broker = getattr(request, "param", "redis")
    if broker == "rabbitmq":
        problem = PrivateRabbitMQ.available() or (None if shutil.which("epmd") else "epmd is not installed")
        if problem:
            require_service("rabbitmq-server", False, problem)
    network = Network(HOSTS)
    fleet = Fleet(network, tmp_path, broker=broker)
    try:
        network.create()
        fleet.start_services()
        fleet.use_delay_proxy("w3")
        yield fleet
    finally:
        fleet.close()
        network.destroy()
