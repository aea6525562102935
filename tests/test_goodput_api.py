"""Goodput from stored rows: a job's rounds, metric tiles, checkpoints and a ``job.hang`` event are
read into the timeline (console/telemetry/goodput_data.py) and served by the API
(``/api/v1/jobs/<id>/goodput/``, ``/api/v1/goodput/``) and ``/metrics``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from console.jobs.models import Checkpoint, Job, Round
from console.telemetry.goodput_data import job_goodput
from console.telemetry.models import Event, Metric, MetricRollup

pytestmark = pytest.mark.django_db

T0 = datetime.now(UTC) - timedelta(hours=1)  # within the cluster's last day


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def steps(job: Job, number: int, first: int, last: int, start: float, per_step: float = 1.0) -> None:
    """Rank 0 logs loss and the SDK's step time for steps first..last, one every per_step s."""
    for i, step in enumerate(range(first, last + 1)):
        for name, value in (("loss", 1.0 / step), ("step_time_s", per_step), ("data_wait_s", 0.1 * per_step)):
            Metric.objects.create(
                job=job,
                round_number=number,
                rank=0,
                seq=step * 3 + len(name),
                step=step,
                name=name,
                value=value,
                time=at(start + i * per_step),
            )
    for name in ("loss", "step_time_s", "data_wait_s"):
        rows = Metric.objects.filter(job=job, round_number=number, name=name)
        for bucket in sorted({m.step // 100 * 100 for m in rows}):
            tile = [m for m in rows if bucket <= m.step < bucket + 100]
            MetricRollup.objects.create(
                job=job,
                round_number=number,
                rank=0,
                name=name,
                bucket_step=bucket,
                last_step=max(m.step for m in tile),
                min_value=min(m.value for m in tile),
                max_value=max(m.value for m in tile),
                total=sum(m.value for m in tile),
                count=len(tile),
                first_time=min(m.time for m in tile),
                last_time=max(m.time for m in tile),
            )


def make_round(
    job: Job, number: int, reason: str, created: float, ended: float, outcome: str, **extra: object
) -> None:
    rnd = Round.objects.create(
        job=job,
        number=number,
        reason=reason,
        world_size=2,
        master_addr="127.0.0.1",
        master_port=29500 + number,
        state="ended",
        outcome=outcome,
        ended_at=at(ended),
        **extra,
    )
    Round.objects.filter(pk=rnd.pk).update(created_at=at(created))


@pytest.fixture
def scripted_job() -> Job:
    """Queued 10 s; round 1 steps 1..50 (t 21..70); a rank fails at 71; round 2 (failure) from
    73 resumes at step 41 (first logged at 78) to step 100 (137); a checkpoint blocked 2 s at
    100; a job.hang in round 2 that saw no progress from 110 to 112; finished at 140."""
    job = Job.objects.create(
        name="scripted", workload="mlp", state="SUCCEEDED", round_number=2, finished_at=at(140)
    )
    Job.objects.filter(pk=job.pk).update(created_at=at(0))
    job.refresh_from_db()
    make_round(job, 1, "start", 10, 73, "failed", failed_at=at(71))
    make_round(job, 2, "failure", 73, 140, "succeeded")
    steps(job, 1, 1, 50, 21)
    steps(job, 2, 41, 100, 78)
    Checkpoint.objects.create(job=job, round_number=2, step=60, path="/c/60", blocking_ms=2000)
    Checkpoint.objects.filter(job=job).update(created_at=at(100))
    Event.objects.create(
        job=job, round_number=2, kind="job.hang", message="hung", data={"since": at(110).timestamp()}
    )
    Event.objects.filter(job=job).update(created_at=at(112))
    return job


def test_the_breakdown_of_stored_rows_adds_up_to_the_truth(scripted_job: Job) -> None:
    totals = job_goodput(scripted_job).totals()
    assert totals["queued"] == pytest.approx(10)
    assert totals["starting"] == pytest.approx(10)  # 10 → 20, step 1 began one step before its log
    assert totals["redone"] == pytest.approx(10)  # steps 41..50 again
    assert totals["restoring"] == pytest.approx(7)  # step 50 at 70 → step 41 began at 77
    assert totals["checkpoint"] == pytest.approx(2)
    assert totals["hung"] == pytest.approx(2)
    assert totals["ending"] == pytest.approx(3)
    stepping = (70 - 20 - 10) + (137 - 77 - 2 - 2)
    assert totals["data"] == pytest.approx(stepping * 0.1)
    assert totals["productive"] == pytest.approx(stepping * 0.9)
    assert sum(totals.values()) == pytest.approx(140)


def test_the_api_serves_a_job_and_the_cluster(scripted_job: Job, viewer: User) -> None:
    client = Client()
    client.force_login(viewer)
    body = client.get(f"/api/v1/jobs/{scripted_job.pk}/goodput/?bins=14").json()
    assert body["wall_seconds"] == pytest.approx(140)
    assert body["seconds"]["redone"] == pytest.approx(10)
    assert len(body["bins"]) == 14
    assert body["bins"][0]["queued"] == pytest.approx(10)
    assert [s["bucket"] for s in body["segments"]][:3] == ["queued", "starting", "productive"]
    assert body["goodput"] == pytest.approx(body["seconds"]["productive"] / 140)

    bad = client.get(f"/api/v1/jobs/{scripted_job.pk}/goodput/?bins=x")
    assert bad.status_code == 400 and "bins" in bad.content.decode()
    assert client.get("/api/v1/jobs/999999/goodput/").status_code == 404
    assert Client().get(f"/api/v1/jobs/{scripted_job.pk}/goodput/").status_code in (401, 403)

    cluster = client.get("/api/v1/goodput/").json()
    # The scripted job ran within the last day: the cluster's day is that job.
    assert set(cluster) == {"day", "week"}
    assert cluster["day"]["jobs"] == 1 and cluster["week"]["jobs"] == 1
    assert cluster["day"]["goodput"] == pytest.approx(body["goodput"])
    assert cluster["day"]["seconds"]["redone"] == pytest.approx(10)


def test_prometheus_has_each_running_jobs_goodput(viewer: User) -> None:
    now = datetime.now(UTC)
    job = Job.objects.create(name="live", workload="mlp", state="RUNNING", round_number=1)
    Job.objects.filter(pk=job.pk).update(created_at=now - timedelta(seconds=60))
    rnd = Round.objects.create(
        job=job,
        number=1,
        reason="start",
        world_size=1,
        master_addr="127.0.0.1",
        master_port=29500,
        state="running",
    )
    Round.objects.filter(pk=rnd.pk).update(created_at=now - timedelta(seconds=30))
    client = Client()
    client.force_login(viewer)
    text = client.get("/metrics").content.decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    # Queued 30 s of 60; the round (no step yet, a plain script) runs since.
    assert samples[
        "trainyard_job_goodput_seconds", (("bucket", "queued"), ("job", str(job.pk)))
    ] == pytest.approx(30, abs=2)
    assert samples["trainyard_job_goodput_ratio", (("job", str(job.pk)),)] == pytest.approx(0.5, abs=0.05)
    assert samples["trainyard_cluster_goodput_ratio", (("window", "day"),)] == pytest.approx(0.5, abs=0.05)
