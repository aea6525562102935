"""What the job page opens with: round boundaries on the step axis, the script's own progress
total, and log history paged back by id and filtered by round (the logs API)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from rest_framework.test import APIClient

from console.jobs.models import Job, Round
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from console.telemetry.models import LogLine
from console.web.job_page import page_config, progress_total, round_boundaries

pytestmark = pytest.mark.django_db


def make_rounds(job: Job, *specs: tuple[int, str, int]) -> None:
    for number, reason, world in specs:
        Round.objects.create(
            job=job, number=number, reason=reason, world_size=world, master_addr="h", master_port=29500
        )


def test_each_later_round_starts_where_its_points_begin() -> None:
    # Given three rounds: the second resumed at step 1,234 (mid-tile), the third never stepped
    job = Job.objects.create(name="b", workload="mlp", round_number=3)
    make_rounds(job, (1, "start", 2), (2, "resize", 3), (3, "failure", 3))
    t = time.time()
    rows = [(job.pk, 1, 0, s, s, "loss", 1.0, t) for s in range(1, 1300)]
    rows += [(job.pk, 2, 0, 10_000 + s, s, "loss", 0.5, t) for s in range(1234, 2000)]
    rows += [(job.pk, 1, 0, 20_000, 0, "total_steps", 5000.0, t)]
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)
    # When the page asks for its boundaries
    boundaries = round_boundaries(job, ["loss", "total_steps"])
    # Then only round 2 has one, at its first step, with its reason and world size
    assert boundaries == [{"round": 2, "step": 1234, "reason": "resize", "world": 3}]


def test_progress_total_prefers_the_scripts_own_total() -> None:
    job = Job.objects.create(name="p", workload="mlp", hyperparameters={"steps": 300}, progress={"step": 5})
    assert progress_total(job, []) == 300
    job.progress = {"step": 5, "total": 400}
    assert progress_total(job, []) == 400
    t = time.time()
    with transaction.atomic():
        store_metrics(
            MetricBatch.of(
                [
                    (job.pk, 1, 0, 1, 0, "total_steps", 900.0, t),
                    (job.pk, 1, 0, 2, 0, "total_steps", 1200.0, t),
                ]
            ),
            replay=False,
        )
    # sdk.progress(total), called again with a new total: the newest counts
    assert progress_total(job, ["total_steps"]) == 1200
    assert page_config(job)["total_steps"] == 1200


def test_logs_page_back_by_id_and_filter_by_round(viewer: User) -> None:
    job = Job.objects.create(name="l", workload="mlp", round_number=2)
    now = datetime.now(UTC)
    LogLine.objects.bulk_create(
        LogLine(
            job=job, round_number=1 + (i >= 50), rank=i % 2, stream="stdout", seq=i, text=f"l{i}", time=now
        )
        for i in range(100)
    )
    api = APIClient()
    api.force_authenticate(viewer)
    url = f"/api/v1/jobs/{job.pk}/logs/"
    tail = api.get(url, {"limit": 10}).json()["lines"]
    assert [ln["text"] for ln in tail] == [f"l{i}" for i in range(90, 100)]
    older = api.get(url, {"limit": 10, "before": tail[0]["id"]}).json()["lines"]
    assert [ln["text"] for ln in older] == [f"l{i}" for i in range(80, 90)]
    first_round = api.get(url, {"round": 1, "rank": 1, "limit": 3}).json()["lines"]
    assert [ln["text"] for ln in first_round] == ["l45", "l47", "l49"]
    assert all(ln["round"] == 1 for ln in first_round)
    assert api.get(url, {"before": 0}).status_code == 400
