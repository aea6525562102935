"""What the job page shows of a parameter-server job's roles (GET /api/v1/jobs/<id>/metrics/roles/):
each process's latest statistics from the PS runtime's telemetry, by role and index, where it runs
and whether it still does. Real PostgreSQL; the metrics are rows as ingest stores them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from console.jobs import reports, scheduler
from console.jobs.models import Job
from console.telemetry.models import Metric
from tests.support.decisions import Decide, make_node
from tests.support.jobs import submitted_ps_job
from tests.test_ps_console import worker_exit


def point(job: Job, rank: int, name: str, step: int, value: float, seq: int, round_number: int = 1) -> Metric:
    at = timezone.now() - timedelta(seconds=100 - seq)
    return Metric(
        job=job, round_number=round_number, rank=rank, seq=seq, step=step, name=name, value=value, time=at
    )


def get(user: User, path: str) -> Any:
    client = APIClient()
    client.force_authenticate(user)
    return client.get(path)


def test_each_process_shows_its_latest_values_by_role(decide: Decide, viewer: User) -> None:
    make_node("a", slots=3), make_node("b", slots=3)
    job = submitted_ps_job(
        workers=3
    )  # a: coordinator (rank 0), PS 1 (2), worker 1 (4); b: PS 0 (1), workers 0 (3), 2 (5)
    decide(scheduler.tick)
    url = f"/api/v1/jobs/{job.pk}/metrics/roles/"

    # Before anything reported: every process listed where it runs, its values null
    body = get(viewer, url).json()
    assert [(p["index"], p["node"], p["running"], p["rows"]) for p in body["ps"]] == [
        (0, "b", True, None),
        (1, "a", True, None),
    ]
    assert [(w["index"], w["node"], w["examples_per_s"]) for w in body["workers"]] == [
        (0, "b", None),
        (1, "a", None),
        (2, "b", None),
    ]
    assert body["queue"]["done"] is None and body["queue"]["at"] is None
    assert (body["round"], body["mode"]) == (1, "async")

    Metric.objects.bulk_create(
        [
            # PS 0 (rank 1): the last record it reported is the latest, whatever order they were stored in
            point(job, 1, "ps_rows", 12, 250, seq=5),
            point(job, 1, "ps_rows", 5, 100, seq=2),
            point(job, 1, "ps_rows", 9, 999, seq=4),
            point(job, 1, "ps_memory_bytes", 9, 2.5e8, seq=4),
            point(job, 1, "ps_pull_p99_ms", 9, 1.75, seq=4),
            point(job, 1, "ps_pushes_per_s", 9, 42.0, seq=4),
            # The next round's points are not this round's
            point(job, 1, "ps_rows", 50, 7, seq=1, round_number=2),
            # PS 1 (rank 2)
            point(job, 2, "ps_rows", 4, 120, seq=1),
            # The queue (coordinator, rank 0): idle reports repeat a step; the later seq wins
            point(job, 0, "queue_done", 600, 3, seq=1),
            point(job, 0, "queue_done", 600, 4, seq=2),
            point(job, 0, "queue_todo", 600, 12, seq=2),
            point(job, 0, "queue_in_progress", 600, 2, seq=2),
            point(job, 0, "queue_epoch", 600, 0, seq=2),
            point(job, 0, "queue_epochs", 600, 2, seq=2),
            # Worker 0 (rank 3) and worker 1 (rank 4); a rank's own names only
            point(job, 3, "worker_examples_per_s", 40, 120.5, seq=2),
            point(job, 3, "worker_staleness_max", 40, float("inf"), seq=2),
            point(job, 3, "worker_staleness_mean", 40, 1.5, seq=2),
            point(job, 4, "worker_examples_per_s", 20, 80.0, seq=1),
            point(job, 4, "ps_rows", 20, 5, seq=1),
        ]
    )
    # Worker 1 ends: still listed with its last values, no longer running
    decide(reports.rank_exited, "a", job.pk, 1, worker_exit(2, 4))

    body = get(viewer, url).json()
    ps0, ps1 = body["ps"]
    assert (ps0["rows"], ps0["memory_bytes"], ps0["pull_p99_ms"], ps0["pushes_per_s"]) == (
        250,
        2.5e8,
        1.75,
        42.0,
    )
    assert ps0["push_p99_ms"] is None and ps0["at"] is not None
    assert (ps1["rows"], ps1["memory_bytes"]) == (120, None)
    queue = body["queue"]
    assert (queue["epoch"], queue["epochs"], queue["done"], queue["in_progress"], queue["todo"]) == (
        0,
        2,
        4,
        2,
        12,
    )
    w0, w1, w2 = body["workers"]
    assert (w0["examples_per_s"], w0["staleness_mean"], w0["staleness_max"]) == (120.5, 1.5, None)
    assert (w1["examples_per_s"], w1["running"], w0["running"]) == (80.0, False, True)
    assert "rows" not in w1 and w2["examples_per_s"] is None

    # Another round by number: its own points
    assert get(viewer, url + "?round=1").json()["ps"][0]["rows"] == 250
    missing = get(viewer, url + "?round=9")
    assert missing.status_code == 404 and "no round 9" in missing.json()["detail"]


def test_a_job_without_roles_is_refused_clearly(decide: Decide, viewer: User) -> None:
    make_node("a", slots=2)
    job = Job.objects.create(name="ddp", entrypoint="/bin/true")
    response = get(viewer, f"/api/v1/jobs/{job.pk}/metrics/roles/")
    assert response.status_code == 400
    assert "not a parameter_server job" in str(response.json())
    assert get(viewer, "/api/v1/jobs/999999/metrics/roles/").status_code == 404
