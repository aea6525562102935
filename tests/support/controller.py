"""A real controller (Celery worker on queue "control" with embedded beat) as a subprocess.

Used by the end-to-end tests together with tests/support/agents.py: the test process acts as
the web tier (it calls the API in-process against the same test database), the controller and
agents run as real processes against that database and a Redis database of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from django.db import connection

from tests.support import procs

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def database_url() -> str:
    """URL of the database the running test uses (pytest-django's test database)."""
    s = connection.settings_dict
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or "5432"
    user = s.get("USER") or "postgres"
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


def service_env(redis_url: str, home: Path, **extra: str) -> dict[str, str]:
    from django.conf import settings

    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "REDIS_URL": redis_url,
            "TRAINYARD_HOME": str(home),
            "SECRET_KEY": settings.SECRET_KEY,
            "TRAINYARD_NODE_TOKEN": settings.NODE_TOKEN,
            "TRAINYARD_HEARTBEAT_INTERVAL": str(settings.HEARTBEAT_INTERVAL),
            "TRAINYARD_HEARTBEAT_MISSES": str(settings.HEARTBEAT_MISSES),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra)
    return env


def controller_argv(workdir: Path, name: str = "", schedule: Path | None = None) -> list[str]:
    """The controller: a Celery worker on queue ``control`` with its beat embedded, threads pool."""
    return [
        str(VENV_BIN / "celery"),
        "-A",
        "console",
        "worker",
        "-Q",
        "control",
        "-B",
        "-s",
        str(schedule or workdir / f"beat-{uuid.uuid4().hex[:8]}"),
        "--pool",
        "threads",
        "-c",
        "4",
        "-n",
        f"{name or 'controller-' + uuid.uuid4().hex[:6]}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]


class Controller:
    """One controller process; ``kill()`` is SIGKILL, ``start()`` may be called again after it."""

    def __init__(
        self,
        redis_url: str,
        workdir: Path,
        *,
        base_env: dict[str, str] | None = None,
        die_with_parent: bool = False,
        **env: str,
    ) -> None:
        """``base_env``: the whole environment (a bench's); by default the test database's
        (``service_env``). ``env`` adds to it."""
        self.redis_url = redis_url
        self.workdir = workdir
        self.base_env = base_env
        self.die_with_parent = die_with_parent
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"controller-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**self.base_env, **self.env} if self.base_env is not None else None
        self.proc = procs.spawn(
            controller_argv(self.workdir),
            cwd=REPO,
            env=env or service_env(self.redis_url, self.workdir, **self.env),
            log=self.log_path,
            stdin=subprocess.DEVNULL,
            die_with_parent=self.die_with_parent,
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def kill(self) -> None:
        """SIGKILL the whole controller (worker and beat threads die with it)."""
        if self.proc:
            procs.kill(self.proc)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc:
            procs.stop(self.proc, grace=timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_for(predicate: Any, timeout: float, interval: float = 0.2, message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``message`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}")
