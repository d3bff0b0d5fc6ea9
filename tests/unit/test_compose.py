"""docker-compose.yml held against the code it runs (there is no Docker engine here to run it).

Every command must name a real app module and a real CLI command, every ``THREADS_*`` variable a
real setting, every published port the default the program listens on, and every long-running
service must have a health check and a restart policy.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
SERVICES = {"postgres", "redis", "migrate", "worker", "control-worker", "beat", "flower", "api"}
OUR_IMAGE = {"migrate", "worker", "control-worker", "beat", "flower", "api"}
#: Services that run tools (and so read and write thread files) or serve them.
FILE_USERS = {"worker", "control-worker", "api"}
ONE_SHOT = {"migrate"}
CORE_VARS = {"THREADS_DATABASE_URL", "THREADS_BROKER_URL", "THREADS_AGENTS"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value`` in ``args``."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports", [])}


def cli_command(*path: str) -> Any:
    """The click command behind ``threads-celery <path...>``, or None."""
    import typer

    from threads_celery.cli.app import app

    command: Any = typer.main.get_command(app)
    for name in path:
        commands = getattr(command, "commands", {})
        if name not in commands:
            return None
        command = commands[name]
    return command


def test_every_service_is_there(services: dict[str, Any]) -> None:
    assert set(services) == SERVICES


def test_worker_beat_and_flower_run_the_same_app_module_which_exists(services: dict[str, Any]) -> None:
    apps = set()
    for name, sub in (("worker", "worker"), ("beat", "beat")):
        args = argv(services[name])
        assert args[:2] == ["celery", "-A"] and args[3] == sub, args
        apps.add(args[2])
    assert apps == {"tasks"}
    assert importlib.util.find_spec("tasks") is not None
    module = ast.parse((REPO / "tasks" / "__init__.py").read_text())
    bound = {
        t.id for node in module.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    bound |= {
        alias.asname or alias.name for node in module.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert "app" in bound  # what `celery -A tasks` looks for
    # `tasks` is not installed with the package (it would shadow a user's own tasks.py): the image
    # finds it in /app, which is on its PYTHONPATH.
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY tasks ./tasks" in dockerfile and "COPY beat ./beat" in dockerfile
    assert re.search(r"PYTHONPATH=/app\b", dockerfile) and re.search(r"^WORKDIR /app$", dockerfile, re.MULTILINE)
    assert "-E" in argv(services["worker"]) or "--task-events" in argv(services["worker"])


def test_threads_variables_are_real_settings_and_documented(services: dict[str, Any]) -> None:
    settings_src = (REPO / "threads_celery" / "settings.py").read_text()
    configuration = (REPO / "docs" / "configuration.md").read_text()
    used: set[str] = set()
    for service in services.values():
        env = service.get("environment") or {}
        used |= {
            k
            for k in (env if isinstance(env, dict) else dict(e.split("=", 1) for e in env))
            if k.startswith("THREADS_")
        }
    assert used >= CORE_VARS
    package_src = "\n".join(p.read_text() for p in (REPO / "threads_celery").rglob("*.py"))
    for var in used:
        assert f'"{var}"' in package_src, f"{var} is read nowhere in the package"
    for var in CORE_VARS:
        assert f'"{var}"' in settings_src and var in configuration, var


def test_every_service_of_ours_gets_the_ledger_broker_and_agents(services: dict[str, Any]) -> None:
    from threads_celery.store.engine import parse_database_url

    postgres = services["postgres"]["environment"]
    for name in OUR_IMAGE:
        env = services[name]["environment"]
        assert set(env) >= CORE_VARS, name
        url = parse_database_url(env["THREADS_DATABASE_URL"])
        assert (url.host, url.port, url.database) == ("postgres", 5432, postgres["POSTGRES_DB"])
        assert (url.username, url.password) == (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])
        assert re.fullmatch(r"redis://redis:6379/\d+", env["THREADS_BROKER_URL"])
        for spec in env["THREADS_AGENTS"].split(","):
            assert importlib.util.find_spec(spec.split(":")[0]) is not None, spec


def test_secrets_come_from_the_environment_not_the_file(services: dict[str, Any]) -> None:
    assert re.fullmatch(r"\$\{THREADS_API_TOKENS:\?[^}]+\}", services["api"]["environment"]["THREADS_API_TOKENS"])
    assert "THREADS_API_AUTH" not in services["api"]["environment"]
    for var in ("FLOWER_USER", "FLOWER_PASSWORD"):  # `:?` refuses unset and empty alike
        assert re.fullmatch(rf"\$\{{{var}:\?[^}}]+\}}", services["flower"]["environment"][var]), var
    for name in OUR_IMAGE - {"api"}:
        assert "THREADS_API_TOKENS" not in services[name]["environment"], name


def test_migrate_runs_a_real_cli_command_and_the_api_one_exists(services: dict[str, Any]) -> None:
    args = argv(services["migrate"])
    assert args[0] == "threads-celery"
    assert cli_command(*args[1:]) is not None, args
    assert args[1:] == ["db", "upgrade"]
    api_args = argv(services["api"])
    assert api_args[:2] == ["threads-celery", "api"]
    api = cli_command("api")
    assert api is not None
    options = {opt for param in api.params for opt in getattr(param, "opts", [])}
    assert {"--host", "--port"} <= options
    assert option(api_args, "--host") == "0.0.0.0"  # reachable from outside its container


def test_published_ports_are_the_ones_the_programs_listen_on(services: dict[str, Any]) -> None:
    api = cli_command("api")
    [port_param] = [p for p in api.params if "--port" in p.opts]
    api_args = argv(services["api"])
    assert int(option(api_args, "--port") or port_param.default) == port_param.default == 8000
    assert container_ports(services["api"]) == {8000}

    flower_cli = cli_command("flower")
    [flower_port] = [p for p in flower_cli.params if "--port" in p.opts]
    assert int(option(argv(services["flower"]), "--port") or flower_port.default) == flower_port.default == 5555
    assert container_ports(services["flower"]) == {5555}
    for name in ("api", "flower"):
        for mapping in services[name]["ports"]:
            assert str(mapping).startswith("127.0.0.1:"), f"{name} is published on every interface: {mapping}"


def test_long_running_services_have_health_checks_and_restart_policies(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no" and "healthcheck" not in service
            continue
        check = service.get("healthcheck")
        assert check and check.get("test"), f"{name} has no health check"
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), name
    assert "pg_isready" in str(services["postgres"]["healthcheck"]["test"])
    assert "redis-cli" in str(services["redis"]["healthcheck"]["test"]) and "ping" in str(
        services["redis"]["healthcheck"]["test"]
    )
    assert "8000/healthz" in str(services["api"]["healthcheck"]["test"])
    assert "5555/healthcheck" in str(services["flower"]["healthcheck"]["test"])
    beat_schedule = option(argv(services["beat"]), "--schedule")
    assert beat_schedule and beat_schedule in str(services["beat"]["healthcheck"]["test"])


def test_the_health_endpoints_named_are_real_routes() -> None:
    from threads_celery.api.app import create_api

    app = create_api(object(), tokens={"t"})  # type: ignore[arg-type]  # routes only; nothing is called
    paths = {getattr(route, "path", None) for route in app.routes}
    assert {"/healthz", "/readyz"} <= paths


def test_startup_order_waits_for_health_and_for_the_migration(services: dict[str, Any]) -> None:
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in OUR_IMAGE - ONE_SHOT:
        depends = services[name]["depends_on"]
        assert depends["postgres"] == {"condition": "service_healthy"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name


def test_our_services_build_the_image_from_the_dockerfile(services: dict[str, Any]) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for name in OUR_IMAGE:
        assert services[name]["build"]["context"] == ".", name
    assert re.search(r"^ARG THREADS_EXTRAS=\S*flower", dockerfile, re.MULTILINE)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r"^flower = \[", pyproject, re.MULTILINE)  # the extra the image installs
    assert "COPY examples" in dockerfile  # THREADS_AGENTS=examples.demo must import in the image
    assert {n: services[n]["image"] for n in ("postgres", "redis")} == {"postgres": "postgres:16", "redis": "redis:7"}
    assert any("postgresql/data" in v for v in services["postgres"]["volumes"])


def test_flower_runs_behind_our_launcher_which_guards_metrics_and_refuses_empty_credentials(
    services: dict[str, Any],
) -> None:
    """Flower alone serves /metrics anonymously and accepts `--basic-auth=:`; our launcher does neither."""
    args = argv(services["flower"])
    assert args[:2] == ["threads-celery", "flower"], args
    assert cli_command("flower") is not None
    assert option(args, "--basic-auth") is None  # credentials come from FLOWER_USER/FLOWER_PASSWORD only
    assert option(args, "--unauthenticated-api") is None and "--unauthenticated_api" not in " ".join(args)
    assert not any(
        k.startswith("FLOWER_") and k not in ("FLOWER_USER", "FLOWER_PASSWORD")
        for k in services["flower"]["environment"]
    )
    for mapping in services["flower"]["ports"]:
        assert str(mapping).startswith("127.0.0.1:")


# -- what a production deployment needs (issue 13) -------------------------------------------


def _named_volume_mounts(service: dict[str, Any], compose: dict[str, Any]) -> dict[str, str]:
    """Container path -> named volume, for the service's mounts of declared named volumes."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        source, _, target = str(entry).partition(":")
        if source in (compose.get("volumes") or {}):
            mounts[target.split(":")[0]] = source
    return mounts


def test_the_secret_key_and_model_keys_come_from_the_environment(services: dict[str, Any]) -> None:
    from threads_celery.definitions.variables import SECRET_KEY_ENV

    for name in OUR_IMAGE:
        env = services[name]["environment"]
        # `:?`: compose refuses to start without it, instead of a stack that cannot store secrets.
        assert re.fullmatch(rf"\$\{{{SECRET_KEY_ENV}:\?[^}}]+\}}", env[SECRET_KEY_ENV]), name
        for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            assert env[key] == f"${{{key}:-}}", (name, key)  # passed through, never written here


def test_the_image_installs_the_model_provider_extras(services: dict[str, Any]) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    default = re.search(r"^ARG THREADS_EXTRAS=(\S+)$", dockerfile, re.MULTILINE)
    assert default, "the Dockerfile has no THREADS_EXTRAS build argument"
    assert re.search(r'pip install "\.\[\$\{THREADS_EXTRAS\}\]"', dockerfile)
    pyproject = (REPO / "pyproject.toml").read_text()
    extras = default.group(1).split(",")
    assert {"flower", "openai"} <= set(extras)
    for extra in extras:
        assert re.search(rf"^{extra} = \[", pyproject, re.MULTILINE), extra
    for name in OUR_IMAGE:
        build = services[name]["build"]
        assert build["context"] == "." and build["args"]["THREADS_EXTRAS"] == f"${{THREADS_EXTRAS:-{default.group(1)}}}"


def test_thread_files_are_on_a_volume_every_worker_and_the_api_share(
    services: dict[str, Any], compose: dict[str, Any]
) -> None:
    roots = {services[name]["environment"]["THREADS_FILES_ROOT"] for name in FILE_USERS}
    assert len(roots) == 1
    (root,) = roots
    assert root.startswith("/") and not root.startswith("/tmp")
    volumes = {_named_volume_mounts(services[name], compose).get(root) for name in FILE_USERS}
    assert len(volumes) == 1 and None not in volumes, volumes  # one named volume, mounted by all
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"mkdir -p {root}" in dockerfile and "chown -R threads /var/lib/threads" in dockerfile


def test_beats_schedule_state_is_on_a_volume(services: dict[str, Any], compose: dict[str, Any]) -> None:
    schedule = option(argv(services["beat"]), "--schedule")
    assert schedule and not schedule.startswith("/tmp")
    folder = schedule.rsplit("/", 1)[0]
    assert folder in _named_volume_mounts(services["beat"], compose)
    assert folder in (REPO / "Dockerfile").read_text()  # created and owned by the image's user


def test_a_control_queue_worker_consumes_the_backbones_queue(services: dict[str, Any]) -> None:
    from threads_celery.decisions.backbone import WORK_QUEUE, control_queue_for

    args = argv(services["control-worker"])
    assert args[:4] == ["celery", "-A", "tasks", "worker"]
    assert option(args, "-Q") == control_queue_for(WORK_QUEUE)
    node = option(args, "-n")
    assert node and node.endswith("@%h")
    assert f"--destination {node.split('@')[0]}@$$HOSTNAME" in str(services["control-worker"]["healthcheck"]["test"])
    assert "--destination celery@$$HOSTNAME" in str(services["worker"]["healthcheck"]["test"])


#: Services that run ctx.run_code and so need a cgroup to cap each call (see workspace/cgroups.py).
CODE_RUNNERS = {"worker", "control-worker"}


def test_code_running_workers_get_a_delegated_cgroup_for_run_codes_caps(services: dict[str, Any]) -> None:
    from threads_celery.settings import Settings
    from threads_celery.workspace import cgroups

    entrypoint_path = "/usr/local/bin/sandbox-cgroup-entrypoint.sh"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"COPY docker/sandbox-cgroup-entrypoint.sh {entrypoint_path}" in dockerfile
    script_path = REPO / "docker" / "sandbox-cgroup-entrypoint.sh"
    assert script_path.stat().st_mode & 0o111  # COPY keeps the mode: it must be executable
    script = script_path.read_text()
    for name in CODE_RUNNERS:
        service = services[name]
        assert service["cgroup"] == "private", name  # the container's own subtree to delegate
        assert service["entrypoint"] == [entrypoint_path], name
        assert str(service["user"]) in {"root", "0"}, name  # to prepare it; the script drops to `threads`
        where = service["environment"][cgroups.SETTING]
        assert Settings.from_env({cgroups.SETTING: where}).sandbox_cgroup == where
        # The directory the setting names is the one the entrypoint makes and enables.
        relative = where.removeprefix("/sys/fs/cgroup/")
        assert f'mkdir -p "$CG/threads/worker" "$CG/{relative}"' in script
        assert f'echo "+memory +pids" > "$CG/{relative}/cgroup.subtree_control"' in script
        assert service["environment"]["THREADS_DATABASE_URL"] == services["api"]["environment"]["THREADS_DATABASE_URL"]
    assert "setpriv --reuid=threads" in script and re.search(r"^USER threads$", dockerfile, re.MULTILINE)
    sandbox_docs = (REPO / "docs" / "workspace.md").read_text()
    assert cgroups.SETTING in sandbox_docs and "Delegate=yes" in sandbox_docs


def test_an_unknown_sandbox_cgroup_setting_is_a_config_error() -> None:
    from threads_celery.exceptions import ConfigError
    from threads_celery.settings import Settings

    assert Settings.from_env({}).sandbox_cgroup == "auto"
    with pytest.raises(ConfigError, match="THREADS_SANDBOX_CGROUP"):
        Settings.from_env({"THREADS_SANDBOX_CGROUP": "relative/dir"})


def test_alembic_runs_from_the_images_workdir() -> None:
    """The image holds alembic.ini in its WORKDIR, and the migrations folder it points at."""
    import configparser

    dockerfile = (REPO / "Dockerfile").read_text()
    copies = [line.split()[1:] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    into_workdir = {source for *sources, dest in copies if dest in ("./", ".") for source in sources}
    assert "alembic.ini" in into_workdir, copies
    ini = configparser.ConfigParser()
    ini.read(REPO / "alembic.ini")
    package = ini["alembic"]["script_location"].split("/")[0]
    assert [package, f"./{package}"] in copies, copies
