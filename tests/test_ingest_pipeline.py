"""Ingest in-process against the real Redis stream and PostgreSQL: what gets stored, acked, dropped."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.db.models import Sum

from console.jobs.models import Checkpoint, Job
from console.telemetry.anomalies import AnomalyDetector
from console.telemetry.ingest.cursor import StreamCursor
from console.telemetry.ingest.decoding import decode_entries
from console.telemetry.ingest.loop import IngestLoop
from console.telemetry.ingest.storage import MetricBatch, store_read
from console.telemetry.models import Event, LogLine, Metric, MetricRollup
from tests.support.telemetry import allocate, batch, ingest_loop, metric_records, xadd
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(settings.REDIS_URL)
    c.delete(TELEMETRY_STREAM)
    yield c
    c.delete(TELEMETRY_STREAM)
    c.close()


@pytest.fixture
def job() -> Job:
    job = Job.objects.create(name="ingest", workload="mlp", round_number=1)
    allocate(job)
    return job


def pending(client: redis.Redis) -> int:
    return int(client.xpending(TELEMETRY_STREAM, TELEMETRY_GROUP)["pending"])


def test_records_become_rows_and_entries_are_acked(client: redis.Redis, job: Job) -> None:
    # Given batches of every record kind from two ranks
    for rank in (0, 1):
        xadd(client, batch(job.pk, metric_records(range(0, 50), {"loss": 0.5, "lr": 0.1}), rank=rank))
    xadd(
        client,
        batch(
            job.pk,
            [
                {"kind": "log", "seq": 1, "t": 1.0, "stream": "stdout", "text": "hello"},
                {"kind": "log", "seq": 1, "t": 1.0, "stream": "stderr", "text": "oops"},
                {"kind": "checkpoint", "seq": 2, "t": 1.0, "step": 40, "path": "/c/40.pt", "size_bytes": 9},
                {
                    "kind": "event",
                    "seq": 3,
                    "t": 1.0,
                    "event": "gradient_anomaly",
                    "severity": "warning",
                    "message": "grad exploded",
                    "data": {"norm": float("inf")},
                },
                {"kind": "dropped", "seq": 4, "t": 1.0, "count": 120},
            ],
        ),
    )
    loop = IngestLoop(client, "test")

    # When ingest drains the stream
    loop.drain()

    # Then every point is stored once, the other records became rows, and nothing is pending
    assert Metric.objects.filter(job=job).count() == 2 * 50 * 2
    # with the time each record carries, to the microsecond
    sent = {r["step"]: r["t"] for r in metric_records(range(0, 1), t0=1_700_000_000.123456)}
    xadd(client, batch(job.pk, metric_records(range(0, 1), {"t_check": 1.0}, t0=sent[0])))
    loop.drain()
    stamp = Metric.objects.get(job=job, name="t_check").time
    assert stamp.timestamp() == pytest.approx(sent[0], abs=1e-6) and stamp.microsecond == 123456
    assert sorted(Metric.objects.filter(job=job, rank=1, name="lr").values_list("step", flat=True)) == list(
        range(50)
    )
    assert sorted(LogLine.objects.filter(job=job).values_list("stream", "text")) == [
        ("stderr", "oops"),
        ("stdout", "hello"),
    ]
    assert list(Checkpoint.objects.filter(job=job).values_list("step", "path", "size_bytes")) == [
        (40, "/c/40.pt", 9)
    ]
    anomaly = Event.objects.get(job=job, kind="gradient_anomaly")
    assert (anomaly.severity, anomaly.message, anomaly.data) == (
        "warning",
        "grad exploded",
        {"norm": None, "rank": 0},
    )
    dropped = Event.objects.get(job=job, kind="telemetry_dropped")
    assert dropped.severity == "warning" and "120" in dropped.message
    assert pending(client) == 0

    # and acked entries are trimmed from the stream, unread ones never
    xadd(client, batch(job.pk, metric_records(range(50, 60))))
    loop.cursor.maybe_trim(force=True)
    assert client.xlen(TELEMETRY_STREAM) == 2  # the last delivered entry and the unread one
    loop.drain()
    loop.close()
    assert Metric.objects.filter(job=job).exclude(name="t_check").count() == 2 * 50 * 2 + 10 * 1


def test_replayed_entries_store_nothing_twice(client: redis.Redis, job: Job) -> None:
    # Given entries that were stored but whose ack was lost (the ingest crashed after commit)
    xadd(client, batch(job.pk, metric_records(range(100))))
    xadd(client, batch(job.pk, [{"kind": "event", "seq": 7, "t": 1.0, "event": "note", "message": "m"}]))
    read = StreamCursor(client, "crashy").read(block_ms=10)
    decoded = decode_entries(read.entries)
    store_read(decoded, MetricBatch.of(decoded.metrics), replay=read.replay, detector=AnomalyDetector())
    assert pending(client) == len(read.entries) == 2

    # When a new ingest with the same consumer name starts
    with ingest_loop(client, "crashy") as second:
        second.drain()

    # Then the pending entries were read again and acked, with no duplicate rows or events
    assert pending(client) == 0
    assert Metric.objects.filter(job=job).count() == 100
    assert Event.objects.filter(job=job, kind="note").count() == 1


def test_unknown_jobs_and_malformed_entries_are_acked_and_dropped(client: redis.Redis, job: Job) -> None:
    xadd(client, batch(job.pk + 1000, metric_records(range(10))))
    xadd(client, "{not json")
    client.xadd(TELEMETRY_STREAM, {"other": "field"})
    xadd(
        client,
        batch(
            job.pk,
            [
                {"kind": "metric", "seq": "x", "step": 1, "values": {"loss": 1}},
                {"kind": "mystery", "seq": 1},
                {"kind": "metric", "seq": 5, "t": 2.0, "step": 5, "values": {"loss": 0.25, "bad": "text"}},
            ],
        ),
    )
    with ingest_loop(client, "test") as loop:
        loop.drain()

    assert pending(client) == 0
    assert list(Metric.objects.values_list("job_id", "step", "name", "value")) == [(job.pk, 5, "loss", 0.25)]


def test_a_batch_sent_again_is_stored_once_without_a_failed_write(
    client: redis.Redis, job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    # Given points already stored
    first = batch(job.pk, metric_records(range(0, 100), {"loss": lambda s: float(s)}))
    xadd(client, first)
    with ingest_loop(client, "again") as loop:
        loop.drain()

        # When the agent sends the same batch again (its XADD reply was lost), with new points
        xadd(client, first)
        xadd(client, batch(job.pk, metric_records(range(100, 150), {"loss": lambda s: float(s)})))
        loop.drain()

    # Then each point is stored and counted in its tile once, and no write failed on the way
    assert sorted(Metric.objects.filter(job=job).values_list("step", flat=True)) == list(range(150))
    assert MetricRollup.objects.filter(job=job).aggregate(n=Sum("count"))["n"] == 150
    assert not [
        r for r in caplog.records if r.name.startswith("console.telemetry") and r.levelno >= logging.WARNING
    ]
    assert pending(client) == 0
