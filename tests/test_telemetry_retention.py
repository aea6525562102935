"""Retention rolls old raw points up into step buckets (not just deletes them) and prunes old logs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from console.jobs.models import Job
from console.telemetry.downsample import query_series
from console.telemetry.models import LogLine, Metric, MetricRollup
from console.telemetry.tasks import rollup


@pytest.fixture
def job(db: None) -> Job:
    return Job.objects.create(name="ret", workload="mlp", round_number=1)


@override_settings(METRIC_RETENTION_DAYS=7, METRIC_ROLLUP_STEPS=100, LOG_RETENTION_DAYS=3)
def test_old_points_become_rollups_and_queries_still_see_them(job: Job) -> None:
    now = datetime.now(UTC)
    old, recent = now - timedelta(days=10), now - timedelta(days=1)
    rows = [
        Metric(
            job=job,
            round_number=1,
            rank=0,
            seq=step,
            step=step,
            name="loss",
            value=float(step % 100) + (1000.0 if step == 150 else 0.0),
            time=old if step < 1000 else recent,
        )
        for step in range(1500)
    ]
    Metric.objects.bulk_create(rows)
    LogLine.objects.create(job=job, round_number=1, rank=0, seq=1, text="old", time=now - timedelta(days=5))
    LogLine.objects.create(job=job, round_number=1, rank=0, seq=2, text="new", time=now)
    before = query_series(job.pk, "loss", points=15)

    result = rollup()

    assert result == {"points_rolled_up": 1000, "log_lines_deleted": 1}
    assert Metric.objects.filter(job=job).count() == 500
    buckets = list(MetricRollup.objects.filter(job=job).order_by("bucket_step"))
    assert [b.bucket_step for b in buckets] == list(range(0, 1000, 100))
    first = buckets[1]
    assert (first.count, first.min_value, first.max_value, first.last_step) == (100, 0.0, 1050.0, 199)
    assert first.mean == pytest.approx((sum(range(100)) + 1000) / 100)
    assert list(LogLine.objects.values_list("text", flat=True)) == ["new"]

    # The downsampled view over the whole run is unchanged by the rollup.
    after = query_series(job.pk, "loss", points=15)
    assert [(b.min, b.max, b.count) for b in after] == [(b.min, b.max, b.count) for b in before]
    assert [b.mean for b in after] == pytest.approx([b.mean for b in before])

    # Running again moves nothing twice; later-expiring points merge into existing buckets.
    assert rollup() == {"points_rolled_up": 0, "log_lines_deleted": 0}
    Metric.objects.create(
        job=job, round_number=1, rank=0, seq=10_000, step=150, name="loss", value=-5.0, time=old
    )
    rollup()
    merged = MetricRollup.objects.get(job=job, bucket_step=100)
    assert (merged.count, merged.min_value, merged.max_value) == (101, -5.0, 1050.0)
