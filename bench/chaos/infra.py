"""The processes a chaos run starts, and how it finds and stops every one of them.

Every process the run starts carries ``TRAINYARD_CHAOS_RUN=<run id>`` in its environment, and
so does everything those processes start (agents hand their environment to ranks, warm
interpreters and the reaper; pg_ctl to the postmaster). ``marked_processes`` reads it back from
``/proc/<pid>/environ``: the final sweep kills whatever is left by pid, and the orphan count is
taken from the same list. Also here: a PostgreSQL cluster of the run's own (initdb/pg_ctl from
the Debian packages; restartable, unlike the shared one). Processes are started, and stopped,
through tests/support/procs.py (tests/support/services.py knows each component's command line).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from workers import net

MARK = "TRAINYARD_CHAOS_RUN"


def wait_until(check: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return bool(check())


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# --- finding and stopping processes ------------------------------------------------------------


_SEEN: dict[int, float] = {}
"""Every process of the run seen so far (pid → create time): one that was ours stays ours after
its parent dies and it is reparented, even if it retitled itself over its environment block
(Celery's beat process does: after the controller's SIGKILL it lives on as "[celery beat]")."""


def marked_processes(run_id: str) -> dict[int, psutil.Process]:
    """Live (non-zombie) processes of the run: those whose environment holds its mark, every
    descendant of this process, and every process seen as one of those before (same pid and
    start time)."""
    needle = f"{MARK}={run_id}".encode()
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(me).children(recursive=True):
            found[proc.pid] = proc
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me or int(entry.name) in found:
            continue
        with contextlib.suppress(OSError, psutil.Error):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = psutil.Process(int(entry.name))
    for pid, created in list(_SEEN.items()):
        if pid not in found:
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 0.01:
                    found[pid] = proc
                    continue
            except psutil.Error:
                pass
            del _SEEN[pid]
    live: dict[int, psutil.Process] = {}
    for pid, proc in found.items():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                _SEEN.setdefault(pid, proc.create_time())
                live[pid] = proc
    return live


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every descendant, the root first."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and all its descendants at once (a container going down). The tree
    is listed first, so children cannot be reparented away between the kills."""
    procs = tree(pid)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    return [p.pid for p in procs]


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sweep(run_id: str) -> list[int]:
    """SIGKILL every process of the run that is still alive; returns their pids."""
    killed: list[int] = []
    for _ in range(3):  # a dying parent may fork once more; look again
        procs = marked_processes(run_id)
        if not procs:
            break
        for proc in procs.values():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)
        wait_until(lambda procs=procs: not any(alive(pid) for pid in procs), 5)  # type: ignore[misc]
    return sorted(set(killed))


# --- PostgreSQL --------------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """The newest Debian PostgreSQL binaries, or pg_config's."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for bindir in reversed(candidates):
        if (bindir / "pg_ctl").exists():
            return bindir
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if out and (Path(out) / "pg_ctl").exists():
            return Path(out)
    return None


@dataclass
class PostgresCluster:
    """A cluster of our own on a free port: initdb into ``root``, pg_ctl start/stop/restart.
    As root, PostgreSQL runs as the ``postgres`` user (it refuses to run as root)."""

    root: Path
    env: dict[str, str]
    port: int = 0

    def __post_init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries found (apt-get install postgresql)")
        self.bindir = bindir
        self.port = self.port or net.free_port()
        self.data = self.root / "pgdata"
        self.sockets = self.root / "pgsock"
        self.log = self.root / "postgres.log"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = list(argv)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {result.stdout}{result.stderr}")
        return result

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            self.root.chmod(0o755)
            for path in (self.root, self.sockets):
                shutil.chown(path, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        # fsync off: this cluster is thrown away after the run, and the machine is shared.
        # A fast shutdown checkpoints anyway, so a restart loses nothing either way.
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            "30",
            "stop",
            check=False,
        )

    def running(self) -> bool:
        return (
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "status", check=False).returncode
            == 0
        )

    def restart(self, outage: float) -> None:
        """A fast shutdown (clients disconnected, a checkpoint), ``outage`` seconds down, a start."""
        self.stop("fast")
        time.sleep(outage)
        self.start()

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
