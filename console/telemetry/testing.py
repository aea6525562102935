"""Helpers shared by the telemetry tests and bench: batches in the agent's wire format, a private
redis-server, a signed-in session cookie. Nothing here is used by the running console."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore

from console.telemetry.ingest.loop import IngestLoop
from workers.protocol import TELEMETRY_STREAM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch(job_id: int, records: list[dict[str, Any]], *, round_number: int = 1, rank: int = 0) -> str:
    return json.dumps(
        {"job_id": job_id, "round": round_number, "rank": rank, "node": "test-node", "records": records}
    )


def metric_records(
    steps: range, values: dict[str, Any] | None = None, *, t0: float | None = None, dt: float = 0.0
) -> list[dict[str, Any]]:
    """One metric record per step, seq = step; ``values`` maps name → constant or callable(step)."""
    values = values or {"loss": lambda s: 1.0 / (s + 1)}
    start = time.time() if t0 is None else t0
    out = []
    for i, step in enumerate(steps):
        out.append(
            {
                "kind": "metric",
                "seq": step,
                "t": start + i * dt,
                "step": step,
                "values": {k: (v(step) if callable(v) else v) for k, v in values.items()},
            }
        )
    return out


def xadd(client: redis.Redis, payload: str, stream: str = TELEMETRY_STREAM) -> str:
    entry_id = client.xadd(stream, {"batch": payload})
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def session_cookie(user: User) -> str:
    """A session for ``user`` as the login view would make it; returns the cookie value."""
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"


class RedisServer:
    """A private redis-server on a free port, append-only so its stream survives a restart."""

    def __init__(self, workdir: Path, appendonly: bool = True, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.workdir),
                "--save",
                "",
                "--appendonly",
                "yes" if self.appendonly else "no",
                "--appendfsync",
                "always",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        """SIGTERM: redis flushes its append-only file and exits."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@contextmanager
def ingest_loop(client: redis.Redis, consumer: str, **options: Any) -> Iterator[IngestLoop]:
    """The ingest loop of ``manage.py ingest``, in this process; its writer thread ends on exit."""
    loop = IngestLoop(client, consumer, **options)
    try:
        yield loop
    finally:
        loop.close()
