"""Anomaly events computed on ingest fire once per episode, even when batches are replayed."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from console.jobs.models import Job
from console.telemetry.models import Event, Metric
from tests.support.telemetry import allocate, batch, ingest_loop, metric_records, xadd
from workers.protocol import TELEMETRY_STREAM

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
    job = Job.objects.create(name="anomalies", workload="mlp", round_number=1)
    allocate(job, nproc=3)
    return job


def ingest(client: redis.Redis, payloads: list[str]) -> None:
    for payload in payloads:
        xadd(client, payload)
    with ingest_loop(client, "anomaly-test") as loop:
        loop.drain()


def kinds(job: Job, kind: str) -> list[Event]:
    return list(Event.objects.filter(job=job, kind=kind).order_by("pk"))


def test_non_finite_loss_fires_once_per_episode_across_ranks(client: redis.Redis, job: Job) -> None:
    def loss(step: int) -> float:
        return float("nan") if 100 <= step < 150 or step >= 300 else 1.0

    def sdk_loss(step: int) -> float | None:
        return None if 100 <= step < 150 or step >= 300 else 1.0  # the SDK sends NaN as null

    payloads = [
        batch(job.pk, metric_records(range(0, 200), {"loss": loss}), rank=0),
        # rank 1 ships late: its NaN steps arrive after rank 0 already recovered
        batch(job.pk, metric_records(range(0, 200), {"loss": sdk_loss}), rank=1),
        batch(job.pk, metric_records(range(200, 320), {"loss": loss}), rank=0),
        batch(job.pk, metric_records(range(200, 320), {"loss": sdk_loss}), rank=1),
    ]
    ingest(client, payloads)
    events = kinds(job, "loss_not_finite")
    assert [e.data["step"] for e in events] == [100, 300]
    assert all(e.severity == "error" and "nan" in e.message for e in events)
    # the SDK's nulls are stored as NaN: the chart shows the gap
    stored = Metric.objects.get(job=job, rank=1, step=120, name="loss").value
    assert math.isnan(stored)

    # A replay of the same batches (ingest crashed before acking) stores no new events.
    ingest(client, payloads)
    assert len(kinds(job, "loss_not_finite")) == 2


def test_gradient_norm_spike_over_ten_times_the_rolling_median(client: redis.Redis, job: Job) -> None:
    def grad(step: int) -> float:
        if step in (120, 121, 122):
            return 50.0
        if step == 200:
            return 9.0  # 9x: below the 10x threshold
        if step == 250:
            return 12.0
        return 1.0 + (step % 5) * 0.01

    ingest(
        client,
        [batch(job.pk, metric_records(range(0, 300), {"grad_norm": grad}), rank=r) for r in (0, 1)],
    )
    events = kinds(job, "gradient_spike")
    assert [e.data["step"] for e in events] == [120, 250]
    assert "x the rolling median" in events[0].message


def test_straggler_only_after_a_minute_of_slowness(client: redis.Redis, job: Job) -> None:
    t0 = 1_700_000_000.0

    def slow_rank2(step: int) -> float:
        return 0.3 if step >= 20 else 0.1

    def briefly_slow(step: int) -> float:
        return 0.3 if 10 <= step < 50 else 0.1  # 40 s of slowness: not a straggler

    payloads = [
        # the SDK's step monitor name
        batch(job.pk, metric_records(range(150), {"step_time_s": 0.1}, t0=t0, dt=1.0), rank=0),
        batch(job.pk, metric_records(range(150), {"step_time_s": briefly_slow}, t0=t0, dt=1.0), rank=1),
        batch(job.pk, metric_records(range(150), {"step_time_s": slow_rank2}, t0=t0, dt=1.0), rank=2),
    ]
    ingest(client, payloads)
    events = kinds(job, "straggler")
    assert len(events) == 1
    assert events[0].data["rank"] == 2
    # slow from step 22 on (smoothing over 5 points); reported once a minute later
    assert 80 <= events[0].data["step"] <= 90
    assert "Rank 2 is a straggler" in events[0].message


def test_throughput_drop_fires_once(client: redis.Redis, job: Job) -> None:
    def throughput(step: int) -> float:
        return 30.0 if 100 <= step < 160 else 100.0

    ingest(client, [batch(job.pk, metric_records(range(220), {"samples_per_s": throughput}))])
    events = kinds(job, "throughput_drop")
    assert len(events) == 1
    assert 100 <= events[0].data["step"] <= 110
    assert events[0].data["baseline"] == 100.0
