"""Telemetry is bound to the node that ships it and to the round's allocation
(console/telemetry/ingest/trust.py).

Attack: anyone who can write to the Redis stream (any local user of bin/run's Redis, another
tenant's agent host) XADDs batches naming someone else's job, to put metrics, logs and events
into it. Before entries were sealed ingest stored them all; now it stores a batch only when it is
sealed by a live node (an HMAC over the node's name and the batch, keyed by its credential) whose
allocation in that round holds the batch's rank. The rest is dropped, acked, counted by reason
(``trainyard_ingest_refused_entries_total``) and logged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from console.cluster import tokens
from console.cluster.models import NodeCredential
from console.jobs.models import Allocation, Job
from console.telemetry.models import Event, LogLine, Metric
from tests.support.telemetry import allocate, batch, ingest_loop, metric_records, xadd
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM
from workers.signing import report_key, telemetry_entry

pytestmark = pytest.mark.django_db(transaction=True)

SECRET_A, SECRET_B = "tyn_node-a-secret", "tyn_node-b-secret"


@pytest.fixture(autouse=True)
def no_shared_token(settings: Any) -> None:
    settings.NODE_TOKEN = ""  # only each node's own credential speaks for it


@pytest.fixture
def victim() -> Job:
    """A job running ranks 0 and 1 on node-a; node-b runs another user's job."""
    job = Job.objects.create(name="victim", workload="mlp", round_number=1)
    allocate(job, node="node-a", secret=SECRET_A)
    allocate(Job.objects.create(name="other", workload="mlp", round_number=1), node="node-b", secret=SECRET_B)
    return job


def refused(viewer: User, reason: str) -> float:
    """``trainyard_ingest_refused_entries_total{reason=...}`` as /metrics exposes it."""
    web = Client()
    web.force_login(viewer)
    text = web.get("/metrics").content.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "trainyard_ingest_refused_entries_total" and sample.labels == {
                "reason": reason
            }:
                return float(sample.value)
    raise AssertionError(f"no refused count for {reason} in:\n{text}")


def forged_log(job: Job, text: str, rank: int = 0) -> str:
    return batch(job.pk, [{"kind": "log", "seq": 1, "t": 1.0, "stream": "stdout", "text": text}], rank=rank)


def test_only_a_batch_sealed_by_the_node_running_its_rank_is_stored(
    stream: redis.Redis, victim: Job, viewer: User, caplog: pytest.LogCaptureFixture
) -> None:
    # Given someone with write access to the stream, and node-b (enrolled, running its own job)
    # When they XADD batches for the victim's job: (a) unsealed, (b) sealed by node-b for a rank
    # node-a runs, (c) node-a's sealed batch altered after sealing, (d) sealed by a node nobody
    # enrolled, (e) sealed by node-b for a rank past those the round has
    stream.xadd(TELEMETRY_STREAM, {"batch": forged_log(victim, "unsealed")})
    xadd(stream, forged_log(victim, "node-b for node-a", rank=0), node="node-b", secret=SECRET_B)
    entry = telemetry_entry(report_key(SECRET_A), "node-a", forged_log(victim, "as sealed"))
    entry["batch"] = forged_log(victim, "altered").encode()
    stream.xadd(TELEMETRY_STREAM, entry)
    xadd(stream, forged_log(victim, "ghost"), node="ghost", secret="tyn_made-up")
    xadd(stream, forged_log(victim, "rank 7", rank=7), node="node-b", secret=SECRET_B)
    # and node-a ships its ranks' telemetry as its agent does
    xadd(stream, batch(victim.pk, metric_records(range(10))), node="node-a", secret=SECRET_A)
    xadd(stream, batch(victim.pk, metric_records(range(10)), rank=1), node="node-a", secret=SECRET_A)
    with (
        caplog.at_level(logging.WARNING, logger="console.telemetry.ingest.trust"),
        ingest_loop(stream, "trust") as loop,
    ):
        loop.drain()
        loop.stats.maybe_report(force=True)

    # Then only node-a's own batches are stored, every entry is acked (none comes back),
    assert not LogLine.objects.exists() and not Event.objects.exists()
    assert sorted(Metric.objects.filter(job=victim).values_list("rank", flat=True).distinct()) == [0, 1]
    assert Metric.objects.filter(job=victim).count() == 20
    assert stream.xpending(TELEMETRY_STREAM, TELEMETRY_GROUP)["pending"] == 0
    # each refusal is counted by its reason and logged
    assert refused(viewer, "unsigned") == 1
    assert refused(viewer, "not_allocated") == 2
    assert refused(viewer, "bad_mac") == 1
    assert refused(viewer, "unknown_node") == 1
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "(not_allocated): node 'node-b' does not run job" in logged
    assert "(bad_mac)" in logged and "(unsigned)" in logged and "(unknown_node)" in logged


def test_a_revoked_node_is_refused_within_seconds(stream: redis.Redis, victim: Job, viewer: User) -> None:
    # Given an ingest that has believed node-a (its key cached)
    with ingest_loop(stream, "revoked") as loop:
        xadd(stream, batch(victim.pk, metric_records(range(5))), node="node-a", secret=SECRET_A)
        loop.drain()
        assert Metric.objects.filter(job=victim).count() == 5

        # When an operator revokes node-a's credential
        tokens.revoke(NodeCredential.objects.get(node_name="node-a"), None)

        # Then what node-a seals is refused once the cached key has expired (seconds)
        time.sleep(loop.gate.keys.ttl + 0.1)
        xadd(stream, batch(victim.pk, metric_records(range(5, 10))), node="node-a", secret=SECRET_A)
        loop.drain()
        loop.stats.maybe_report(force=True)
    assert Metric.objects.filter(job=victim).count() == 5
    assert refused(viewer, "unknown_node") == 1


def test_ranks_the_console_just_gave_a_node_are_believed_at_once(stream: redis.Redis) -> None:
    # Given a parameter-server round whose members ingest has read (node-a: the coordinator, rank 0)
    job = Job.objects.create(name="ps", workload="mlp", round_number=1, strategy="parameter_server")
    alloc = allocate(job, node="node-a", secret=SECRET_A, nproc=1)
    Allocation.objects.filter(pk=alloc.pk).update(processes=[{"role": "coordinator", "index": 0, "rank": 0}])
    with ingest_loop(stream, "grown") as loop:
        xadd(stream, batch(job.pk, metric_records(range(3))), node="node-a", secret=SECRET_A)
        loop.drain()

        # When the console gives node-a a new worker process (rank 5) in the same round, and
        # node-a ships its first points
        workers = [{"role": "coordinator", "index": 0, "rank": 0}, {"role": "worker", "index": 0, "rank": 5}]
        Allocation.objects.filter(pk=alloc.pk).update(processes=workers)
        xadd(stream, batch(job.pk, metric_records(range(3)), rank=5), node="node-a", secret=SECRET_A)
        loop.drain()

    # Then they are stored: the members are read again for a rank they lack, not refused
    assert sorted(Metric.objects.filter(job=job).values_list("rank", flat=True).distinct()) == [0, 5]
