"""Retention deletes old raw points but their tiles stay: long-run curves survive; old logs go."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.test import override_settings

from console.jobs.models import Job
from console.telemetry.downsample import query_series
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from console.telemetry.models import LogLine, Metric, MetricRollup
from console.telemetry.tasks import rollup

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(METRIC_RETENTION_DAYS=7, LOG_RETENTION_DAYS=3)
def test_old_points_leave_tiles_and_queries_still_see_them() -> None:
    job = Job.objects.create(name="ret", workload="mlp", round_number=1)
    now = time.time()
    old, recent = now - 10 * 86400, now - 86400
    rows = [
        (
            job.pk,
            1,
            0,
            step,
            step,
            "loss",
            float(step % 100) + (1000.0 if step == 150 else 0.0),
            old if step < 1000 else recent,
        )
        for step in range(1500)
    ]
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)
        # a replayed batch must not count twice in the tiles
        store_metrics(MetricBatch.of(rows[:300]), replay=True)
    LogLine.objects.create(
        job=job, round_number=1, rank=0, seq=1, text="old", time=datetime.now(UTC) - timedelta(days=5)
    )
    LogLine.objects.create(job=job, round_number=1, rank=0, seq=2, text="new", time=datetime.now(UTC))
    tile = MetricRollup.objects.get(job=job, bucket_step=100)
    assert (tile.count, tile.min_value, tile.max_value, tile.last_step) == (100, 0.0, 1050.0, 199)
    assert tile.mean == pytest.approx((sum(range(100)) + 1000) / 100)
    before = [(b.min, b.max, b.count) for b in query_series(job.pk, "loss", points=15)]
    narrow_before = query_series(job.pk, "loss", start=120, end=180, points=1000)
    assert len(narrow_before) == 61  # raw points, one per step

    result = rollup()

    assert result == {"points_deleted": 1000, "log_lines_deleted": 1}
    assert Metric.objects.filter(job=job).count() == 500
    assert MetricRollup.objects.filter(job=job).count() == 15
    assert list(LogLine.objects.values_list("text", flat=True)) == ["new"]
    # The whole-run view is unchanged; a narrow range over deleted points is answered by tiles.
    assert [(b.min, b.max, b.count) for b in query_series(job.pk, "loss", points=15)] == before
    narrow = query_series(job.pk, "loss", start=120, end=180, points=1000)
    assert [(b.step, b.last_step, b.max, b.count) for b in narrow] == [(100, 199, 1050.0, 100)]
    assert rollup() == {"points_deleted": 0, "log_lines_deleted": 0}
