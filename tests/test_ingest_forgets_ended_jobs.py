"""Ingest drops what it keeps per job (live frames, frame numbers, anomaly detector state) once
the job has ended or is gone, and keeps it for jobs that still run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from console.jobs.models import Job
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


def test_state_of_ended_and_deleted_jobs_is_dropped(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three jobs whose losses ingest has seen and framed
    jobs = [
        Job.objects.create(name=f"j{i}", workload="mlp", round_number=1, state="RUNNING") for i in range(3)
    ]
    for job in jobs:
        allocate(job)
        xadd(client, batch(job.pk, metric_records(range(10), {"loss": 0.5, "grad_norm": 1.0})))
    with ingest_loop(client, "forget") as loop:
        loop.drain()
        loop.flush_frames(force=True)
        assert loop.writer.detector.jobs() == {j.pk for j in jobs}
        assert loop.frames.jobs() == {j.pk for j in jobs}

        # When one succeeds and another is deleted, and the loop's periodic sweep comes round
        Job.objects.filter(pk=jobs[0].pk).update(state="SUCCEEDED")
        Job.objects.filter(pk=jobs[1].pk).delete()
        monkeypatch.setattr("console.telemetry.ingest.loop.FORGET_EVERY", 0.0)
        loop.drain()
        loop.writer.wait_idle()

        # Then only the running job's state is left
        assert loop.writer.detector.jobs() == {jobs[2].pk}
        assert loop.frames.jobs() == {jobs[2].pk}
