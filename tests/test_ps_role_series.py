"""A parameter-server job's role charts read one metric of a role as a series per process
(GET /api/v1/jobs/<id>/metrics/roles/series/): each PS's own values on its own version counter,
never a mean over processes, only the round's processes, and bad questions get a 400. Real
PostgreSQL; the points are stored as ingest stores them (with their tiles)."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from rest_framework.test import APIClient

from console.jobs import scheduler
from console.jobs.models import Job
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from tests.support.decisions import Decide, make_job, make_node
from tests.support.jobs import submitted_ps_job


def get(user: User, path: str) -> Any:
    client = APIClient()
    client.force_authenticate(user)
    return client.get(path)


def store(rows: list[tuple[int, int, int, int, int, str, float]]) -> None:
    with transaction.atomic():
        store_metrics(MetricBatch.of([(*row, time.time()) for row in rows]), replay=False)


def test_a_role_metric_is_a_series_per_process_of_the_round(decide: Decide, viewer: User) -> None:
    make_node("a", slots=3)
    make_node("b", slots=3)
    job = submitted_ps_job(
        workers=3
    )  # a: coordinator (rank 0), PS 1 (2), worker 1 (4); b: PS 0 (1), workers 0 (3), 2 (5)
    decide(scheduler.tick)
    job.refresh_from_db()
    rows: list[tuple[int, int, int, int, int, str, float]] = []
    for version in range(1, 51):
        rows.append((job.pk, 1, 1, version, version, "ps_rows", 1000.0 + version))  # PS 0
        rows.append((job.pk, 1, 2, version, version, "ps_rows", 10.0))  # PS 1
    rows.append((job.pk, 2, 1, 1, 60, "ps_rows", 5.0))  # a later round's rank 1: not this round's PS 0
    rows.append((job.pk, 1, 3, 1, 7, "worker_examples_per_s", 99.0))  # worker 0
    store(rows)
    url = f"/api/v1/jobs/{job.pk}/metrics/roles/series/"

    body = get(viewer, f"{url}?role=ps&name=ps_rows&points=10").json()
    assert (body["round"], body["role"], body["name"]) == (1, "ps", "ps_rows")
    assert set(body["series"]) == {"0", "1"}
    ps0, ps1 = body["series"]["0"], body["series"]["1"]
    # Each PS its own values on its own versions: PS 0 grows, PS 1 stays at 10 (a mean would not)
    assert (ps0[0]["step"], ps0[-1]["last_step"], sum(b["count"] for b in ps0)) == (1, 50, 50)
    assert ps0[-1]["max"] == 1050.0 and {b["max"] for b in ps1} == {10.0}

    # ``from`` reads only what a chart does not hold yet
    newer = get(viewer, f"{url}?role=ps&name=ps_rows&from=46").json()["series"]
    assert [b["step"] for b in newer["0"]] == [46, 47, 48, 49, 50]

    workers = get(viewer, f"{url}?role=worker&name=worker_examples_per_s").json()["series"]
    assert set(workers) == {"0", "1", "2"} and workers["0"][0]["mean"] == 99.0 and workers["1"] == []


def test_bad_questions_get_a_400_or_a_404(decide: Decide, viewer: User) -> None:
    make_node("a", slots=3)
    make_node("b", slots=3)
    job = submitted_ps_job(workers=2)
    decide(scheduler.tick)
    url = f"/api/v1/jobs/{job.pk}/metrics/roles/series/"
    assert get(viewer, f"{url}?role=ps&name=worker_examples").status_code == 400  # not a PS metric
    assert get(viewer, f"{url}?role=boss&name=ps_rows").status_code == 400
    assert get(viewer, f"{url}?name=ps_rows").status_code == 400
    assert get(viewer, f"{url}?role=ps&name=ps_rows&round=9").status_code == 404
    assert get(viewer, "/api/v1/jobs/999999/metrics/roles/series/?role=ps&name=ps_rows").status_code == 404
    plain = make_job("plain")
    answer = get(viewer, f"/api/v1/jobs/{plain.pk}/metrics/roles/series/?role=ps&name=ps_rows")
    assert answer.status_code == 400 and "parameter_server" in str(answer.json())
    assert Job.objects.count() == 2
