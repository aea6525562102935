"""docker-compose.yml and the Dockerfile point at real entry points of this project.

No Docker engine runs here, so the files are parsed and every command is resolved against
the code: management commands exist, modules import, the Celery and ASGI apps load.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from django.core.management import get_commands

from workers.protocol import CONTROL_QUEUE

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROJECT_IMAGE = "trainyard:latest"


def dockerfile_cmd() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    match = re.search(r"^CMD (\[.*\])$", text, re.MULTILINE)
    assert match, "Dockerfile has no exec-form CMD"
    return list(yaml.safe_load(match.group(1)))


def argv_of(command: Any) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def commands_in(argv: list[str]) -> list[list[str]]:
    """Split `sh -c "a && b"` into its commands; anything else is one command."""
    if argv[:2] in (["sh", "-c"], ["bash", "-c"], ["CMD-SHELL"]):
        script = argv[-1]
        return [shlex.split(part) for part in re.split(r"&&|;|\|\|", script) if part.strip()]
    if argv[:1] == ["CMD"]:
        return [argv[1:]]
    return [argv]


def check_entry_point(argv: list[str]) -> str:
    """Raise if argv does not start something that exists in this project; say what it runs."""
    program = argv[0]
    if program in ("python", "python3") and argv[1] == "manage.py":
        assert argv[2] in get_commands(), f"no management command {argv[2]!r}"
        return f"manage.py {argv[2]}"
    if program in ("python", "python3") and argv[1] == "-m":
        module = argv[2]
        spec = importlib.util.find_spec(module)
        assert spec is not None, f"no module {module}"
        if spec.submodule_search_locations is not None:
            assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{module} has no __main__"
        return f"python -m {module}"
    if program == "celery":
        app_name = argv[argv.index("-A") + 1]
        celery_module = importlib.import_module(f"{app_name}.celery" if "." not in app_name else app_name)
        assert isinstance(celery_module.app, Celery)
        return f"celery {argv[argv.index('-A') + 2]}"
    if program == "daphne":
        target = next(a for a in argv[1:] if ":" in a and not a.startswith("-"))
        module_name, attr = target.split(":")
        assert getattr(importlib.import_module(module_name), attr) is not None
        return "daphne"
    raise AssertionError(f"unknown entry point {argv!r}")


def project_services() -> list[str]:
    return [name for name, svc in SERVICES.items() if svc.get("image") == PROJECT_IMAGE or "build" in svc]


def test_every_required_service_is_there() -> None:
    assert {"postgres", "redis", "web", "controller", "ingest", "agent"} <= set(SERVICES)


@pytest.mark.parametrize("name", project_services())
def test_service_command_points_at_a_real_entry_point(name: str) -> None:
    svc = SERVICES[name]
    argv = argv_of(svc["command"]) if "command" in svc else dockerfile_cmd()
    for command in commands_in(argv):
        check_entry_point(command)


def test_dockerfile_default_command_is_the_web_server() -> None:
    assert check_entry_point(dockerfile_cmd()) == "python -m console.webserver"


def test_dockerfile_copies_paths_that_exist() -> None:
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), source


def test_controller_consumes_the_control_queue_and_runs_beat() -> None:
    argv = argv_of(SERVICES["controller"]["command"])
    assert check_entry_point(argv) == "celery worker"
    assert argv[argv.index("-Q") + 1] == CONTROL_QUEUE
    assert "-B" in argv


def test_healthchecks_are_defined_and_project_ones_resolve() -> None:
    for name, svc in SERVICES.items():
        if name == "migrate":
            continue
        assert "healthcheck" in svc, f"{name} has no healthcheck"
        test = svc["healthcheck"]["test"]
        for command in commands_in(argv_of(test)):
            if command[0] in ("celery", "python"):
                check_entry_point(command)


def test_agent_reserves_nvidia_gpus() -> None:
    devices = SERVICES["agent"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_agent_enrols_with_a_join_token_and_gets_the_broker_by_environment() -> None:
    svc = SERVICES["agent"]
    argv = argv_of(svc["command"])
    assert check_entry_point(argv) == "python -m workers.agent"
    assert "--name" in argv and "--console" in argv and "--broker" not in argv  # argv is public
    assert "TRAINYARD_JOIN_TOKEN" in svc["environment"]
    assert re.fullmatch(
        r"redis://:\$\{TRAINYARD_REDIS_PASSWORD[^}]*\}@.+:6379/0", svc["environment"]["TRAINYARD_BROKER_URL"]
    )
    # No service holds the shared node token (it speaks for any node: bin/run's opt-in only)
    assert "TRAINYARD_NODE_TOKEN" not in (REPO / "docker-compose.yml").read_text()
    assert "jointoken" in get_commands()


def test_volumes_are_named_and_declared() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    used = set()
    for svc in SERVICES.values():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                used.add(source)
    assert used
    assert used <= declared


def test_dependencies_name_real_services_and_wait_for_health() -> None:
    for name, svc in SERVICES.items():
        for dep, condition in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert condition["condition"] in ("service_healthy", "service_completed_successfully")


def test_console_services_get_database_and_redis_urls() -> None:
    for name in ("migrate", "web", "controller", "ingest"):
        env = SERVICES[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in env["DATABASE_URL"]
        assert re.fullmatch(r"redis://:\$\{TRAINYARD_REDIS_PASSWORD[^}]*\}@redis:6379/0", env["REDIS_URL"])


def test_redis_keeps_streams_and_queues_across_a_restart() -> None:
    # Telemetry in flight and broker messages survive a Redis restart only with an append-only
    # file on a volume (the embedded Redis of `bin/run` runs the same way: test_embedded_redis.py).
    svc = SERVICES["redis"]
    argv = next(c for c in commands_in(argv_of(svc["command"])) if "redis-server" in c)
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] in ("everysec", "always")
    assert any(volume.split(":")[1] == "/data" for volume in svc["volumes"])


def test_redis_has_a_password_that_is_on_no_command_line() -> None:
    svc = SERVICES["redis"]
    script = argv_of(svc["command"])[-1]
    server = next(c for c in commands_in(argv_of(svc["command"])) if "redis-server" in c)
    assert (
        "requirepass" in script and "requirepass" not in server and "REDIS_PASSWORD" not in " ".join(server)
    )
    assert svc["environment"]["REDIS_PASSWORD"].startswith("${TRAINYARD_REDIS_PASSWORD")
    assert "REDISCLI_AUTH" in svc["environment"]  # the healthcheck's redis-cli authenticates
