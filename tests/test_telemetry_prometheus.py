"""/metrics: the Prometheus exposition (text or OpenMetrics) for signed-in users and API tokens,\nrefused to anonymous callers."""

from __future__ import annotations

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from console.api.models import ApiToken
from console.cluster.models import Gpu, Node
from console.jobs.models import Job
from tests.support.telemetry import allocate, batch, ingest_loop, metric_records, xadd

pytestmark = pytest.mark.django_db(transaction=True)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample, read back with prometheus-client's own parser."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    raise AssertionError(f"{name}{labels} missing from:\n{text}")


def test_metrics_exposition(stream: redis.Redis, viewer: User) -> None:
    Job.objects.create(name="a", workload="mlp", state="RUNNING")
    Job.objects.create(name="b", workload="mlp", state="RUNNING")
    job = Job.objects.create(name="c", workload="mlp", round_number=1)
    node = Node.objects.create(name="gpu-1", state="ONLINE", cpu_percent=50.0)
    Node.objects.create(name="gone", state="LOST")
    Gpu.objects.create(node=node, index=0, name="A100", utilization=87.5, memory_used_bytes=2 * 2**30)
    allocate(job, node="gpu-1")

    # Ingest consumed 3 entries and left 2 pending (read, not acked).
    for i in range(3):
        xadd(stream, batch(job.pk, metric_records(range(i * 10, i * 10 + 10))), node="gpu-1")
    with ingest_loop(stream, "prom") as loop:
        loop.drain()
        loop.stats.maybe_report(force=True)
        xadd(stream, batch(job.pk, metric_records(range(100, 110))), node="gpu-1")
        xadd(stream, batch(job.pk, metric_records(range(110, 120))), node="gpu-1")
        assert len(loop.cursor.read(block_ms=10).entries) == 2

    anonymous = Client().get("/metrics")
    assert anonymous.status_code in (401, 403)

    web = Client()
    web.force_login(viewer)
    response = web.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert sample(text, "trainyard_jobs", state="RUNNING") == 2
    assert sample(text, "trainyard_jobs", state="PENDING") == 1
    assert sample(text, "trainyard_nodes", state="LOST") == 1
    assert sample(text, "trainyard_gpu_utilization_ratio", node="gpu-1", gpu="0") == 0.875
    assert sample(text, "trainyard_gpu_memory_used_bytes", node="gpu-1", gpu="0") == 2 * 2**30
    assert sample(text, "trainyard_node_cpu_utilization_ratio", node="gpu-1") == 0.5
    assert sample(text, "trainyard_ingest_up") == 1
    assert sample(text, "trainyard_ingest_pending_entries") == 2
    assert sample(text, "trainyard_ingest_oldest_pending_age_seconds") < 60
    assert sample(text, "trainyard_ingest_points_total") == 30
    assert "# TYPE trainyard_ingest_points_total counter" in text
    assert sample(text, "trainyard_ingest_refused_entries_total", reason="bad_mac") == 0

    # A Prometheus server asks for OpenMetrics first; prometheus-client answers in it.
    openmetrics = web.get(
        "/metrics", HTTP_ACCEPT="application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
    )
    assert openmetrics["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.content.decode().rstrip().endswith("# EOF")

    _, raw = ApiToken.issue(viewer, "prometheus")
    by_token = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert by_token.status_code == 200
    assert sample(by_token.content.decode(), "trainyard_nodes", state="ONLINE") == 1
    bad_token = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ty_nope")
    assert bad_token.status_code == 401
