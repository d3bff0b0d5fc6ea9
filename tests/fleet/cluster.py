"""The fleet: PostgreSQL and PgBouncer, a broker, prefork workers, Beat and the API, each on a host
of its own (a network namespace, :mod:`tests.fleet.network`).

- ``db``: PostgreSQL (``initdb`` of our own, listening on the host's address and on a Unix
  socket) and PgBouncer in front of it (transaction pooling, port 6432);
- ``broker``: ``redis-server --protected-mode no`` on the host's address and a Unix socket, or
  (``broker="rabbitmq"``) RabbitMQ with quorum queues and publisher confirms
  (:mod:`tests.fleet.rabbitmq_host`);
- ``w1``, ``w2``, ``w3``: ``celery -A tasks worker --pool prefork`` (their ledger is PgBouncer);
- ``beat``: ``celery -A tasks beat``;
- ``api``: ``threads-celery api`` on a Unix socket (the test reaches it there).

The test process stays in the machine's namespace: it starts runs and reads the ledger through
the Unix sockets of PostgreSQL and Redis (RabbitMQ through a proxy into the broker's namespace),
which no fault touches. Every process is started through
:mod:`tests.support.processes` (its own process group, SIGKILLed at teardown). :class:`Fleet` is a
:class:`~tests.chaos.conftest.ChaosCluster`: the soak's agents, ledger and checks are the chaos
suite's.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.chaos.conftest import DEFAULT_CHAOS_ENV, ChaosCluster
from tests.fleet.network import Network
from tests.fleet.rabbitmq_host import HostRabbitMQ
from tests.support.processes import PG_BIN, REPO_ROOT, BeatProcess, ManagedProcess, WorkerProcess
from tests.support.waiting import Deadline

HOSTS = ("db", "broker", "w1", "w2", "w3", "beat", "api")
WORKER_HOSTS = ("w1", "w2", "w3")
PG_PORT, BOUNCER_PORT, REDIS_PORT = 5432, 6432, 6379
#: The workers' and Beat's database role (the test's client is ``postgres``): statistics per role
#: (pg_stat_statements, pg_stat_activity) tell the fleet's work from the test's reading.
WORKER_USER = "fleet"
LEASE_S = 3.0
TICK_S = 0.5
FLEET_ENV: dict[str, str] = {
    **DEFAULT_CHAOS_ENV,
    "THREADS_TOOL_LEASE_S": str(LEASE_S),
    "THREADS_STEP_LEASE_S": str(LEASE_S),
    "THREADS_RECONCILE_INTERVAL_S": str(TICK_S),
    "THREADS_DATABASE_STARTUP_WAIT_S": "60",
}
#: On RabbitMQ: AMQP heartbeats every 5 s (Celery's default is 120 s), so a link cut for the
#: faults' 15 s is noticed by both ends, as production should configure it.
RABBITMQ_ENV: dict[str, str] = {"THREADS_CELERY_BROKER_HEARTBEAT": "5"}
BROKERS = ("redis", "rabbitmq")
# A worker's connection to the ledger notices a dead link within seconds, as production should
# configure it: TCP keepalives, a user timeout on unacknowledged data, a short connect timeout.
PG_LINK_OPTIONS = (
    "connect_timeout=3&keepalives=1&keepalives_idle=2&keepalives_interval=1&keepalives_count=3&tcp_user_timeout=5000"
)

__all__ = ["BOUNCER_PORT", "BROKERS", "HOSTS", "LEASE_S", "TICK_S", "WORKER_HOSTS", "Fleet"]


def _owned_dir(prefix: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    shutil.chown(directory, user="postgres", group="postgres")
    directory.chmod(0o755)
    return directory


class Fleet(ChaosCluster):
    """A fleet on ``network``; :meth:`start_services`, then workers and Beat. ``broker``: ``redis``
    or ``rabbitmq``."""

    def __init__(
        self, network: Network, directory: Path, *, broker: str = "redis", settings_env: dict[str, str] | None = None
    ) -> None:
        assert broker in BROKERS, broker
        self.network = network
        self.broker = broker
        self.pg_dir = _owned_dir("threads-fleet-pg-")
        self.redis_dir = Path(tempfile.mkdtemp(prefix="threads-fleet-redis-"))
        self.database = "fleet"
        self.rabbitmq: HostRabbitMQ | None = None
        observer_db = f"postgresql+psycopg://postgres@/{self.database}?host={self.pg_dir}&port={PG_PORT}"
        observer_broker = f"redis+socket://{self.redis_dir}/redis.sock?virtual_host=0"
        broker_env: dict[str, str] = {}
        if broker == "rabbitmq":
            self.rabbitmq = HostRabbitMQ(network.ns("broker"), network.address_of("broker"))
            observer_broker = self.rabbitmq.url
            broker_env = RABBITMQ_ENV
        super().__init__(
            database_url=observer_db,
            broker_url=observer_broker,
            directory=directory,
            settings_env={**FLEET_ENV, **broker_env, **(settings_env or {})},
        )
        self.postgres: ManagedProcess | None = None
        self.bouncer: ManagedProcess | None = None
        self.redis: ManagedProcess | None = None
        self.hosts_of: dict[int, str] = {}  # id(worker) -> host
        self.through_bouncer = True
        #: per worker host, the ledger's address as that host reaches it (a delay proxy may stand in)
        self.db_address: dict[str, str] = {}

    # -- addresses -------------------------------------------------------------------------------

    def worker_database_url(self, host: str) -> str:
        address = self.db_address.get(host) or (
            f"{self.network.addresses['db']}:{BOUNCER_PORT if self.through_bouncer else PG_PORT}"
        )
        # PgBouncer 1.18 in transaction mode keeps no prepared statements: psycopg must not prepare.
        return f"postgresql+psycopg://{WORKER_USER}@{address}/{self.database}?prepare_threshold=none&{PG_LINK_OPTIONS}"

    @property
    def worker_broker_url(self) -> str:
        if self.rabbitmq is not None:
            return self.rabbitmq.fleet_url
        return f"redis://{self.network.addresses['broker']}:{REDIS_PORT}/0"

    def env(self, **extra: str) -> dict[str, str]:
        host = extra.pop("FLEET_HOST", "")
        env = super().env(**extra)
        env["THREADS_DATABASE_URL"] = self.worker_database_url(host)
        env["THREADS_BROKER_URL"] = self.worker_broker_url
        return env

    # -- services -----------------------------------------------------------------------------

    def _as_postgres(self, host: str, argv: list[str]) -> list[str]:
        return self.network.exec_argv(host, ["runuser", "-u", "postgres", "--", *argv])

    def start_services(self) -> None:
        initdb = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(self.pg_dir / "data"),
             "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed: {initdb.stderr}")
        # Every host may connect (trust: the fleet's own throwaway cluster, on its own network).
        with open(self.pg_dir / "data" / "pg_hba.conf", "a") as hba:
            hba.write("host all all 10.88.0.0/24 trust\n")
        self.start_postgres()
        self._wait(lambda: self._psql("select 1", database="postgres"), "PostgreSQL in the db host")
        self._psql(f'create database "{self.database}"', database="postgres")
        self._psql(f"create role {WORKER_USER} superuser login", database="postgres")
        self._psql("create extension if not exists pg_stat_statements")
        self.start_bouncer()
        self.start_broker()
        from threads_celery.store import create_store_engine, parse_database_url
        from threads_celery.store.migrate import upgrade

        engine = create_store_engine(parse_database_url(self.database_url))
        try:
            upgrade(engine)
        finally:
            engine.dispose()

    def start_postgres(self) -> None:
        argv = [str(PG_BIN / "postgres"), "-D", str(self.pg_dir / "data"), "-p", str(PG_PORT), "-k", str(self.pg_dir),
                "-c", f"listen_addresses={self.network.addresses['db']}", "-c", "fsync=off",
                "-c", "full_page_writes=off", "-c", "max_connections=300", "-c", "shared_buffers=64MB",
                "-c", "track_activities=on", "-c", "shared_preload_libraries=pg_stat_statements",
                "-c", "pg_stat_statements.track=all"]  # fmt: skip
        self.postgres = self._start("postgres", self._as_postgres("db", argv))

    def start_bouncer(self) -> None:
        ini = self.pg_dir / "pgbouncer.ini"
        users = self.pg_dir / "userlist.txt"
        users.write_text(f'"postgres" ""\n"{WORKER_USER}" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host={self.pg_dir} port={PG_PORT}\n"
            "[pgbouncer]\n"
            f"listen_addr = {self.network.addresses['db']}\n"
            f"listen_port = {BOUNCER_PORT}\n"
            f"unix_socket_dir = {self.pg_dir}\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            "default_pool_size = 20\n"
            "max_client_conn = 2000\n"
            "admin_users = postgres\n"
            "stats_users = postgres\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.pg_dir / 'pgbouncer.log'}\n"
        )
        for path in (ini, users):
            shutil.chown(path, user="postgres", group="postgres")
        self.bouncer = self._start("pgbouncer", self._as_postgres("db", [str(shutil.which("pgbouncer")), str(ini)]))
        self._wait(lambda: self._bouncer_answers(), "PgBouncer in the db host")

    def restart_bouncer(self) -> None:
        assert self.bouncer is not None
        self.bouncer.kill()
        self.start_bouncer()

    def start_broker(self) -> None:
        if self.rabbitmq is not None:
            self.rabbitmq.start()
        else:
            self.start_redis()

    def stop_broker(self) -> None:
        """The broker goes away: RabbitMQ's orderly shutdown (its quorum queues are kept on disk),
        or Redis killed (it keeps nothing: ``--save ''``, no append-only file)."""
        if self.rabbitmq is not None:
            self.rabbitmq.stop()
        elif self.redis is not None:
            self.redis.kill()

    def start_redis(self) -> None:
        argv = [str(shutil.which("redis-server")), "--bind", self.network.addresses["broker"], "--port", str(REDIS_PORT),
                "--protected-mode", "no", "--unixsocket", str(self.redis_dir / "redis.sock"), "--unixsocketperm", "777",
                "--save", "", "--appendonly", "no", "--dir", str(self.redis_dir)]  # fmt: skip
        self.redis = self._start("redis", self.network.exec_argv("broker", argv))
        self._wait(lambda: self.queued() is not None, "Redis in the broker host")

    def _start(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(f"{name}@{self.network.prefix}", argv, env=dict(os.environ),
                                 log_path=self.directory / f"{name}.log", cwd=self.directory)  # fmt: skip
        process.start()
        self.processes.append(process)
        return process

    @staticmethod
    def _wait(probe: Any, what: str, timeout: float = 60.0) -> None:
        deadline = Deadline(timeout)
        while not probe():
            deadline.check(what)
            time.sleep(0.2)

    def _psql(self, sql: str, *, database: str | None = None) -> bool:
        import psycopg

        try:
            with psycopg.connect(host=str(self.pg_dir), port=PG_PORT, user="postgres",
                                 dbname=database or self.database, autocommit=True, connect_timeout=3) as conn:  # fmt: skip
                conn.execute(sql)  # type: ignore[arg-type]
            return True
        except psycopg.Error:
            return False

    def _bouncer_answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(host=str(self.pg_dir), port=BOUNCER_PORT, user="postgres", dbname="pgbouncer",
                                 autocommit=True, connect_timeout=3) as conn:  # fmt: skip
                conn.execute("SHOW VERSION")
            return True
        except psycopg.Error:
            return False

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        from sqlalchemy import text

        with self.threads.store.engine.connect() as conn:
            return list(conn.execute(text(sql), params or {}))

    def queued(self, queue: str = "threads") -> int | None:
        """Messages waiting in the broker's work queue (every priority list), None while it is away."""
        if self.rabbitmq is not None:
            return self.rabbitmq.queue_depth(queue)
        import redis

        client = redis.Redis(unix_socket_path=str(self.redis_dir / "redis.sock"), socket_timeout=2)
        try:
            keys = [queue, *(f"{queue}\x06\x16{priority}" for priority in (3, 6, 9))]
            return sum(int(client.llen(key)) for key in keys)
        except redis.RedisError:
            return None
        finally:
            client.close()

    # -- workers and Beat -----------------------------------------------------------------------

    def start_worker(
        self, name: str | None = None, *, wait: bool = True, concurrency: int = 2, **env: str
    ) -> WorkerProcess:
        host = env.pop("FLEET_HOST", "w1")
        name = name or f"{host}n{len(self.workers()) + 1}"
        worker = WorkerProcess(
            name, env=self.env(CHAOS_ROLE="worker", FLEET_HOST=host, **env),
            log_path=self.directory / f"{name}.log", concurrency=concurrency,
        )  # fmt: skip
        worker.argv = self.network.exec_argv(host, worker.argv)
        worker.start()
        self.processes.append(worker)
        self.hosts_of[id(worker)] = host
        return worker.wait_ready(timeout=120) if wait else worker

    def start_beat(self, name: str | None = None, *, wait: bool = True, **env: str) -> BeatProcess:
        name = name or "beat"
        beat = BeatProcess(name, env=self.env(FLEET_HOST="beat", **env), log_path=self.directory / f"{name}.log",
                           schedule_path=self.directory / f"{name}-schedule")  # fmt: skip
        beat.argv = self.network.exec_argv("beat", beat.argv)
        beat.start()
        self.processes.append(beat)
        return beat.wait_ready() if wait else beat

    def start_api(self) -> ManagedProcess:
        """The HTTP API in the api host, on a Unix socket in the fleet's directory."""
        socket_path = self.directory / "api.sock"
        env = self.env(FLEET_HOST="api", THREADS_API_TOKENS="fleet-token", THREADS_AGENTS="tests.chaos.chaos_agents")
        argv = [sys.executable, "-m", "uvicorn", "--factory", "threads_celery.api.app:app_from_environment",
                "--uds", str(socket_path), "--log-level", "warning"]  # fmt: skip
        api = ManagedProcess("api", self.network.exec_argv("api", argv), env=env,
                             log_path=self.directory / "api.log", cwd=REPO_ROOT)  # fmt: skip
        api.start()
        self.processes.append(api)
        self._wait(socket_path.exists, "the API's socket")
        return api

    def use_delay_proxy(self, host: str, port: int = 16432) -> None:
        """Route ``host``'s ledger connections through a delay proxy in its namespace (no delay
        until :meth:`set_delay_ms`); call before starting the host's workers."""
        delay_file = self.directory / f"delay-{host}"
        delay_file.write_text("0")
        target = f"{self.network.addresses['db']}:{BOUNCER_PORT}"
        argv = [sys.executable, "-m", "tests.fleet.delay_proxy", "--listen", f"127.0.0.1:{port}", "--to", target,
                "--delay-file", str(delay_file)]  # fmt: skip
        proxy = ManagedProcess(f"delay-{host}", self.network.exec_argv(host, argv), env=dict(os.environ),
                               log_path=self.directory / f"delay-{host}.log", cwd=REPO_ROOT)  # fmt: skip
        proxy.start()
        self.processes.append(proxy)
        proxy.wait_for_log("ready", timeout=30)
        self.db_address[host] = f"127.0.0.1:{port}"

    def set_delay_ms(self, host: str, ms: float) -> None:
        (self.directory / f"delay-{host}").write_text(f"{ms:g}")
        time.sleep(0.5)  # the proxy reads the file every 0.2 s

    def api_start(self, agent: str, message: str) -> tuple[int, str | None]:
        """Start a run through the API (over its Unix socket): the HTTP status and the run's id."""
        import httpx

        transport = httpx.HTTPTransport(uds=str(self.directory / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://api", timeout=60) as client:
            response = client.post("/v1/runs", json={"agent": agent, "message": message},
                                   headers={"Authorization": "Bearer fleet-token"})  # fmt: skip
        run_id = response.json().get("run_id") if response.status_code == 202 else None
        return response.status_code, run_id

    def host_of(self, worker: WorkerProcess) -> str:
        return self.hosts_of[id(worker)]

    def close(self) -> None:
        super().close()
        if self.rabbitmq is not None:
            self.rabbitmq.destroy()
        for directory in (self.pg_dir, self.redis_dir):
            shutil.rmtree(directory, ignore_errors=True)


def postgres_user_exists() -> bool:
    try:
        pwd.getpwnam("postgres")
        return True
    except KeyError:
        return False
