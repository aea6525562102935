"""Helpers shared by the telemetry tests and benches: batches in the agent's wire format, sealed
by an enrolled node that runs their ranks (ingest believes nothing else: console/telemetry/ingest/
trust.py), a signed-in session cookie, the ingest loop in-process. (A private redis-server is
tests/support/services.py's ``RedisServer``.)"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore

from console.cluster.models import Node, NodeCredential
from console.cluster.tokens import hash_secret
from console.jobs.models import Allocation, Job, Round
from console.telemetry.ingest.loop import IngestLoop
from console.telemetry.ingest.stats import STATS_KEY
from workers.protocol import TELEMETRY_STREAM
from workers.signing import report_key, telemetry_entry

NODE = "test-node"
NODE_SECRET = "tyn_test-node-telemetry-secret"


def enrol_node(name: str = NODE, secret: str = NODE_SECRET) -> Node:
    """A node with a credential of ``secret`` (what enrolment would leave in the database)."""
    node, _ = Node.objects.get_or_create(name=name, defaults={"state": "ONLINE"})
    NodeCredential.objects.update_or_create(
        node_name=name, defaults={"secret_hash": hash_secret(secret), "prefix": secret[:10]}
    )
    return node


def allocate(
    job: Job, *, node: str = NODE, secret: str = NODE_SECRET, round_number: int = 1, nproc: int = 2
) -> Allocation:
    """Round ``round_number`` of ``job`` with ``node`` (enrolled with ``secret``) running its ranks
    0 to ``nproc`` - 1 (the job's ``nproc_per_node`` becomes ``nproc``): batches that node seals
    for them are stored by ingest."""
    Job.objects.filter(pk=job.pk).update(nproc_per_node=nproc)
    job.nproc_per_node = nproc
    place, _ = Round.objects.get_or_create(
        job=job,
        number=round_number,
        defaults={"reason": "start", "world_size": nproc, "master_addr": "127.0.0.1", "master_port": 29500},
    )
    return Allocation.objects.create(round=place, node=enrol_node(node, secret), node_rank=0, nproc=nproc)


def batch(
    job_id: int, records: list[dict[str, Any]], *, round_number: int = 1, rank: int = 0, node: str = NODE
) -> str:
    return json.dumps(
        {"job_id": job_id, "round": round_number, "rank": rank, "node": node, "records": records}
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


def xadd(
    client: redis.Redis,
    payload: str,
    stream: str = TELEMETRY_STREAM,
    *,
    node: str = NODE,
    secret: str = NODE_SECRET,
) -> str:
    """XADD ``payload`` as the agent of ``node`` (enrolled with ``secret``) would: sealed."""
    entry_id = client.xadd(stream, telemetry_entry(report_key(secret), node, payload))
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


@pytest.fixture
def stream() -> Iterator[redis.Redis]:
    """The telemetry stream and ingest's stats, empty before and after the test."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(TELEMETRY_STREAM, STATS_KEY)
    yield client
    client.delete(TELEMETRY_STREAM, STATS_KEY)
    client.close()
