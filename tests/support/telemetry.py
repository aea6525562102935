"""Helpers shared by the telemetry tests and benches: batches in the agent's wire format, a
signed-in session cookie, the ingest loop in-process. (A private redis-server is
tests/support/services.py's ``RedisServer``.)"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore

from console.telemetry.ingest.loop import IngestLoop
from workers.protocol import TELEMETRY_STREAM


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
