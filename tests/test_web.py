"""The console's pages: what operators and viewers see, and the JSON the pages poll."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.jobs.models import Allocation, Job, Round
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from console.telemetry.models import Event, LogLine

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_job(operator: User) -> Job:
    node = Node.objects.create(
        name="gpu-a", cpus=16, cpu_percent=42.0, memory_percent=13.0, last_heartbeat=timezone.now()
    )
    Gpu.objects.create(node=node, index=0, name="NVIDIA L4")
    job = Job.objects.create(
        name="digits-ddp",
        workload="digits",
        owner=operator,
        min_nodes=1,
        max_nodes=3,
        desired_nodes=1,
        state="RUNNING",
        round_number=1,
        progress={"step": 50, "total_steps": 200},
    )
    rnd = Round.objects.create(
        job=job, number=1, reason="start", world_size=2, master_addr="10.1.2.3", master_port=29611
    )
    Allocation.objects.create(round=rnd, node=node, node_rank=0, nproc=2, state="RUNNING")
    Event.objects.create(job=job, kind="round.started", message="Round 1 started on gpu-a")
    t = time.time()
    with transaction.atomic():
        store_metrics(
            MetricBatch.of([(job.pk, 1, 0, s, s, "loss", 2.0 / (1 + s), t) for s in range(1000)]),
            replay=False,
        )
    LogLine.objects.create(
        job=job, round_number=1, rank=1, stream="stdout", seq=0, text="hello", time=timezone.now()
    )
    return job


def test_dashboard_summarises_the_cluster(client: Client, viewer: User, running_job: Job) -> None:
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert "digits-ddp" in page
    assert "gpu-a" in page
    assert "NVIDIA L4" in page
    assert "50/200" in page
    summary = client.get("/").context["summary"]
    assert dict(summary["nodes_by_state"])["ONLINE"] == 1
    assert dict(summary["jobs_by_state"])["RUNNING"] == 1
    assert summary["gpus_total"] == 1


def test_job_page_shows_rounds_and_carries_events_and_metric_names(
    client: Client, viewer: User, running_job: Job
) -> None:
    client.force_login(viewer)
    response = client.get(f"/jobs/{running_job.pk}/")
    page = response.content.decode()
    # Each allocation a line of the rounds table: node (linked), node rank, its global ranks,
    # GPUs, state
    line = re.search(r'<ul class="allocs"><li>(.*?)</li></ul>', page)
    assert line is not None
    text = re.sub(r"<[^>]+>", "", line.group(1))
    assert text == "gpu-a node rank 0 · ranks 0\u20131 · CPU RUNNING"
    assert '<a href="/nodes/gpu-a/">gpu-a</a>' in line.group(1)
    config = response.context["config"]
    # The charts fetch their points from the metrics API; the page names what there is.
    assert config["names"] == ["loss"]
    assert [e["message"] for e in config["events"]] == ["Round 1 started on gpu-a"]
    assert config["total_steps"] == 200
    assert 'id="job-config"' in page
    assert list(response.context["rank_choices"]) == [0, 1]


def test_viewer_sees_no_action_buttons(client: Client, viewer: User, running_job: Job) -> None:
    client.force_login(viewer)
    page = client.get(f"/jobs/{running_job.pk}/").content.decode()
    assert 'id="job-actions"' not in page
    assert "Submit job" not in page


def test_operator_sees_resize_within_the_node_range(client: Client, operator: User, running_job: Job) -> None:
    client.force_login(operator)
    page = client.get(f"/jobs/{running_job.pk}/").content.decode()
    assert 'id="job-actions"' in page
    assert 'min="1" max="3" value="1"' in page
    assert 'id="stop-button"' in page and 'id="restart-button"' in page


def test_finished_job_has_its_buttons_disabled(client: Client, operator: User, running_job: Job) -> None:
    Job.objects.filter(pk=running_job.pk).update(state="SUCCEEDED")
    client.force_login(operator)
    page = client.get(f"/jobs/{running_job.pk}/").content.decode()
    assert 'id="stop-button" disabled' in page


def test_submit_page_offers_the_built_in_workloads(client: Client, operator: User) -> None:
    from workers.workloads.catalog import WORKLOADS

    client.force_login(operator)
    response = client.get("/jobs/new/")
    assert response.status_code == 200
    catalog = response.context["catalog"]
    assert set(catalog) == set(WORKLOADS)
    name = next(iter(WORKLOADS))
    assert catalog[name]["hyperparameters"] == WORKLOADS[name].defaults()
    assert f'<option value="{name}">' in response.content.decode()


def test_job_live_json_returns_new_events_only(client: Client, viewer: User, running_job: Job) -> None:
    client.force_login(viewer)
    first = Event.objects.get(job=running_job)
    Event.objects.create(job=running_job, kind="job.resized", message="Now 2 nodes", severity="warning")
    data = client.get(f"/jobs/{running_job.pk}/live/", {"after": first.pk}).json()
    assert data["job"]["state"] == "RUNNING"
    assert data["job"]["world_size"] == 2
    assert [e["message"] for e in data["events"]] == ["Now 2 nodes"]
    # Polling carries log lines after the last one the page holds.
    assert [ln["text"] for ln in data["logs"]] == ["hello"]
    last = data["logs"][-1]["id"]
    assert client.get(f"/jobs/{running_job.pk}/live/", {"log_after": last}).json()["logs"] == []


def test_cluster_live_json_lists_active_jobs_and_nodes(
    client: Client, viewer: User, running_job: Job
) -> None:
    Job.objects.create(name="old", workload="digits", state="STOPPED")
    client.force_login(viewer)
    data = client.get("/live/").json()
    assert [j["name"] for j in data["jobs"]] == ["digits-ddp"]
    assert data["nodes"][0]["name"] == "gpu-a"
    assert data["nodes"][0]["gpus"][0]["name"] == "NVIDIA L4"


def test_node_page_shows_heartbeat_age(client: Client, viewer: User) -> None:
    Node.objects.create(name="cpu-x", last_heartbeat=timezone.now() - timedelta(minutes=5))
    client.force_login(viewer)
    page = client.get("/nodes/").content.decode()
    assert "cpu-x" in page and ">5m<" in page


def test_static_assets_are_served(client: Client, settings: Any) -> None:
    settings.WHITENOISE_USE_FINDERS = True  # as the console runs (tests/conftest.py turns it off)
    for path in (
        "/static/css/console.css",
        "/static/js/job.js",
        "/static/js/dashboard.js",
        "/static/js/node.js",
        "/static/js/submit.js",
        "/static/css/uplot.min.css",
        "/static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js",
    ):
        response = client.get(path)
        assert response.status_code == 200, path


def test_only_operators_get_drain_buttons_on_the_nodes_page(
    client: Client, viewer: User, operator: User, running_job: Job
) -> None:
    client.force_login(viewer)
    assert "data-node-action" not in client.get("/nodes/").content.decode()
    client.force_login(operator)
    page = client.get("/nodes/").content.decode()
    assert 'data-node-action="drain"' in page and 'data-node-action="undrain"' in page


def test_job_table_shows_the_current_world_size(client: Client, viewer: User, running_job: Job) -> None:
    client.force_login(viewer)
    row = next(j for j in client.get("/").context["jobs"] if j.pk == running_job.pk)
    assert row.world_size == 2
