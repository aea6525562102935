"""Events, logs, checkpoints and per-rank timing through the API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from console.jobs.models import Checkpoint, Job
from console.telemetry.events import emit
from console.telemetry.models import LogLine, Metric


@pytest.fixture
def job(db: None) -> Job:
    return Job.objects.create(name="q", workload="mlp", round_number=2)


@pytest.fixture
def api(viewer: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(viewer)
    return client


def test_events_oldest_first_after_a_seq_and_paginated(job: Job, api: APIClient) -> None:
    seqs = [emit("note", f"n{i}", job=job).pk for i in range(60)]
    emit("other-job-or-cluster", "not this job")

    page = api.get(f"/api/v1/jobs/{job.pk}/events/", {"after": seqs[4]}).json()
    assert [e["seq"] for e in page["results"]] == seqs[5:55]
    rest = api.get(page["next"]).json()
    assert [e["seq"] for e in rest["results"]] == seqs[55:]
    assert rest["next"] is None
    back = api.get(rest["previous"]).json()
    assert [e["seq"] for e in back["results"]] == seqs[5:55]
    assert api.get(f"/api/v1/jobs/{job.pk}/events/", {"after": "-3"}).status_code == 400


def test_logs_tail_follow_search_by_rank(job: Job, api: APIClient) -> None:
    now = datetime.now(UTC)
    LogLine.objects.bulk_create(
        LogLine(
            job=job,
            round_number=2,
            rank=i % 2,
            stream="stdout",
            seq=i,
            text=f"line {i} {'ERR' if i % 7 == 0 else 'ok'}",
            time=now,
        )
        for i in range(100)
    )
    tail = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": 1, "limit": 3}).json()
    assert [ln["text"] for ln in tail["lines"]] == ["line 95 ok", "line 97 ok", "line 99 ok"]

    first = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"after": 0, "limit": 10}).json()
    assert [ln["seq"] for ln in first["lines"]] == list(range(10))
    follow = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"after": first["last_id"], "limit": 5}).json()
    assert [ln["seq"] for ln in follow["lines"]] == list(range(10, 15))

    found = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"q": "err", "rank": "0", "limit": "1000"}).json()
    assert [ln["seq"] for ln in found["lines"]] == [i for i in range(100) if i % 14 == 0]
    bad = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"limit": "0", "rank": "a"})
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"limit", "rank"}


def test_checkpoints_newest_first(job: Job, api: APIClient) -> None:
    for step in (100, 300, 200):
        Checkpoint.objects.create(job=job, round_number=2, step=step, path=f"/ck/{step}.pt", size_bytes=step)
    body = api.get(f"/api/v1/jobs/{job.pk}/checkpoints/").json()
    assert [c["step"] for c in body["results"]] == [300, 200, 100]
    assert body["results"][0]["path"] == "/ck/300.pt" and body["results"][0]["round"] == 2
    assert api.get(f"/api/v1/jobs/{job.pk + 5}/checkpoints/").status_code == 404


def test_ranks_show_step_time_throughput_and_stragglers(job: Job, api: APIClient) -> None:
    now = datetime.now(UTC)
    rows = []
    for rank, step_time in ((0, 0.10), (1, 0.11), (2, 0.25)):
        for step in range(40):
            for name, value in (("step_time", step_time), ("throughput", 32 / step_time)):
                rows.append(
                    Metric(
                        job=job,
                        round_number=2,
                        rank=rank,
                        seq=step,
                        step=step,
                        name=name,
                        value=value,
                        time=now,
                    )
                )
    # an older round must not count
    rows.append(Metric(job=job, round_number=1, rank=3, seq=0, step=0, name="step_time", value=9.0, time=now))
    Metric.objects.bulk_create(rows)

    body = api.get(f"/api/v1/jobs/{job.pk}/metrics/ranks/").json()
    assert body["round"] == 2
    assert [(r["rank"], r["straggler"], r["last_step"]) for r in body["ranks"]] == [
        (0, False, 39),
        (1, False, 39),
        (2, True, 39),
    ]
    assert body["ranks"][2]["step_time"] == pytest.approx(0.25)
    assert body["ranks"][0]["throughput"] == pytest.approx(320.0)
    older = api.get(f"/api/v1/jobs/{job.pk}/metrics/ranks/", {"round": 1}).json()
    assert [r["rank"] for r in older["ranks"]] == [3]
