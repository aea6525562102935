"""Downsampling keeps every bucket's extremes: live frames (Python) and the metrics API (SQL)."""

from __future__ import annotations

import math
import random
import time

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from rest_framework.test import APIClient

from console.jobs.models import Job
from console.telemetry.downsample import query_series, thin_points
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from console.telemetry.models import ROLLUP_STEPS


def test_thin_points_keeps_bucket_extremes_and_the_newest_point() -> None:
    rng = random.Random(7)
    points = [(step, rng.gauss(0, 1)) for step in range(10_000)]
    points[4321] = (4321, 99.0)
    points[777] = (777, -99.0)
    points[5000] = (5000, float("nan"))

    thinned = thin_points(points, 100)

    assert len(thinned) <= 100
    assert thinned[-1] == points[-1]
    assert (4321, 99.0) in thinned and (777, -99.0) in thinned
    assert any(math.isnan(v) for _, v in thinned), "a NaN must stay visible"
    assert [s for s, _ in thinned] == sorted(s for s, _ in thinned)
    assert thin_points(points[:50], 100) == points[:50]


@pytest.fixture
def series_job(transactional_db: None) -> tuple[Job, dict[tuple[int, int], float]]:
    job = Job.objects.create(name="ds", workload="mlp", round_number=1)
    rng = random.Random(3)
    values: dict[tuple[int, int], float] = {}
    rows = []
    t = time.time()
    for rank in (0, 1):
        for step in range(0, 20_000, 2):  # every other step: buckets must not assume density
            value = rng.uniform(-1, 1) + (50.0 if (rank, step) == (1, 13_332) else 0.0)
            values[(rank, step)] = value
            rows.append((job.pk, 1, rank, step, step, "loss", value, t))
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)
    return job, values


def test_query_series_buckets_hold_exact_min_max_mean_count(
    series_job: tuple[Job, dict[tuple[int, int], float]],
) -> None:
    job, values = series_job
    buckets = query_series(job.pk, "loss", start=1000, end=15_000, points=137)

    assert 1 <= len(buckets) <= 137
    in_range = {k: v for k, v in values.items() if 1000 <= k[1] <= 15_000}
    assert sum(b.count for b in buckets) == len(in_range)
    for b in buckets:
        inside = [v for (_, step), v in in_range.items() if b.step <= step <= b.last_step]
        assert b.count == len(inside)
        assert b.min == min(inside) and b.max == max(inside)
        assert b.mean == pytest.approx(sum(inside) / len(inside))
    assert max(b.max for b in buckets) == max(in_range.values())  # the spike survives
    assert [b.step for b in buckets] == sorted(b.step for b in buckets)

    only_rank0 = query_series(job.pk, "loss", points=50, rank=0)
    assert sum(b.count for b in only_rank0) == 10_000
    assert max(b.max for b in only_rank0) < 2


def test_wide_ranges_come_from_tiles_with_exact_extremes(
    series_job: tuple[Job, dict[tuple[int, int], float]],
) -> None:
    job, values = series_job
    # 20,000 steps into 50 buckets: 400 steps each, i.e. whole tiles
    buckets = query_series(job.pk, "loss", points=50)
    assert len(buckets) <= 50
    assert sum(b.count for b in buckets) == len(values)
    for b in buckets:
        assert b.step % ROLLUP_STEPS == 0
        inside = [v for (_, step), v in values.items() if b.step <= step <= b.last_step]
        assert (b.min, b.max, b.count) == (min(inside), max(inside), len(inside))
        assert b.mean == pytest.approx(sum(inside) / len(inside))


def test_metrics_api_downsamples_and_validates(
    series_job: tuple[Job, dict[tuple[int, int], float]], viewer: User
) -> None:
    job, values = series_job
    api = APIClient()
    assert api.get(f"/api/v1/jobs/{job.pk}/metrics/").status_code in (401, 403)
    api.force_authenticate(viewer)

    response = api.get(f"/api/v1/jobs/{job.pk}/metrics/", {"points": 100})
    assert response.status_code == 200
    loss = response.json()["series"]["loss"]
    assert len(loss) <= 100
    assert max(b["max"] for b in loss) == max(values.values())
    assert min(b["min"] for b in loss) == min(values.values())

    ranged = api.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss", "from": "100", "to": "109"}).json()
    assert [(b["step"], b["count"]) for b in ranged["series"]["loss"]] == [(s, 2) for s in range(100, 110, 2)]

    missing = api.get(f"/api/v1/jobs/{job.pk + 99}/metrics/")
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"Job {job.pk + 99} does not exist."

    bad = api.get(f"/api/v1/jobs/{job.pk}/metrics/", {"points": "0", "from": "x"})
    assert bad.status_code == 400
    assert set(bad.json()["errors"]) == {"points", "from"}
    backwards = api.get(f"/api/v1/jobs/{job.pk}/metrics/", {"from": 10, "to": 5})
    assert backwards.status_code == 400 and "from" in backwards.json()["errors"]


def test_thin_points_keeps_the_extremes_of_query_series_buckets(
    series_job: tuple[Job, dict[tuple[int, int], float]],
) -> None:
    # Given a stored series and the same points in memory (rank 0, every other step)
    job, values = series_job
    points = sorted((step, v) for (rank, step), v in values.items() if rank == 0)

    # When the API's query and the live frames' thinning cut it into the same number of buckets
    buckets = query_series(job.pk, "loss", points=300, rank=0)
    thinned = thin_points(points, 2 * 300 + 1)

    # Then every bucket's min and max from SQL is among the points thinning keeps, and nothing else
    kept = {v for _, v in thinned}
    assert {b.min for b in buckets} | {b.max for b in buckets} <= kept
    assert len(kept - ({b.min for b in buckets} | {b.max for b in buckets})) <= 1  # the newest point
