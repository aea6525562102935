"""Comparing jobs: given three jobs with metrics stored as ingest stores them (raw points and
their tiles), the comparison API names the hyperparameters that differ (and only those), each
metric's final and best value with their steps, and one metric's series per job by step or by
time; the export gives a job's raw points as CSV and Parquet; ``trainyard compare`` prints the
table over HTTP. Unknown jobs are 404, anonymous callers 401."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from rest_framework.test import APIClient

from console.jobs.models import Job
from console.telemetry.ingest.storage import MetricBatch, store_metrics

START = datetime(2026, 11, 27, 12, tzinfo=UTC)


def make_job(name: str, lr: float, hidden: int, losses: dict[int, float], acc: dict[int, float]) -> Job:
    job = Job.objects.create(
        name=name,
        workload="digits-mlp",
        hyperparameters={"lr": lr, "hidden": hidden, "steps": 300},
        state="SUCCEEDED",
        started_at=START,
    )
    rows = []
    seq = 0
    for name_, values in (("loss", losses), ("accuracy", acc)):
        for step, value in sorted(values.items()):
            seq += 1
            t = (START + timedelta(seconds=step / 10)).timestamp()
            rows.append((job.pk, 1, 0, seq, step, name_, value, t))
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)
    return job


@pytest.fixture
def three(db: None) -> list[Job]:
    a = make_job("cmp-a", 0.1, 64, {s: 5.0 - s / 100 for s in range(1, 301)}, {100: 0.5, 300: 0.9})
    b = make_job(
        "cmp-b", 0.01, 64, {s: 4.0 - s / 200 + (3.0 if s == 150 else 0.0) for s in range(1, 301)}, {300: 0.8}
    )
    c = make_job("cmp-c", 0.01, 128, {s: 2.5 for s in range(1, 201)}, {200: 0.95})
    return [a, b, c]


def api(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def test_the_table_shows_what_differs_and_each_final_and_best(three: list[Job], viewer: User) -> None:
    a, b, c = three
    body = api(viewer).get(f"/api/v1/compare/?jobs={a.pk},{b.pk},{c.pk}").json()
    assert [j["id"] for j in body["jobs"]] == [a.pk, b.pk, c.pk]
    assert body["hyperparameters"] == {
        "hidden": {str(a.pk): 64, str(b.pk): 64, str(c.pk): 128},
        "lr": {str(a.pk): 0.1, str(b.pk): 0.01, str(c.pk): 0.01},
    }
    assert (
        body["same_hyperparameters"] == 6
    )  # steps and spec.workload, nnodes, nproc_per_node, precision, grad_accum_steps
    loss = body["metrics"]["loss"]
    assert loss["higher_is_better"] is False
    assert loss["jobs"][str(a.pk)] == {
        "final": 2.0,
        "final_step": 300,
        "best": 2.0,
        "best_step": 300,
        "points": 300,
    }
    assert loss["jobs"][str(b.pk)]["best"] == 2.5 and loss["jobs"][str(b.pk)]["best_step"] == 300
    assert loss["jobs"][str(c.pk)] == {
        "final": 2.5,
        "final_step": 200,
        "best": 2.5,
        "best_step": 1,
        "points": 200,
    }
    acc = body["metrics"]["accuracy"]
    assert acc["higher_is_better"] is True
    assert acc["jobs"][str(a.pk)]["best"] == 0.9 and acc["jobs"][str(c.pk)]["final"] == 0.95

    by_name = api(viewer).get("/api/v1/compare/?name=cmp-").json()
    assert [j["id"] for j in by_name["jobs"]] == [a.pk, b.pk, c.pk]


def test_series_by_step_keep_the_spike_and_by_time_count_seconds(three: list[Job], viewer: User) -> None:
    a, b, _ = three
    by_step = api(viewer).get(f"/api/v1/compare/series/?jobs={a.pk},{b.pk}&metric=loss&points=20").json()
    buckets = by_step["series"][str(b.pk)]
    assert len(buckets) <= 20 and max(bk["max"] for bk in buckets) == pytest.approx(4.0 - 150 / 200 + 3.0)
    by_time = api(viewer).get(f"/api/v1/compare/series/?jobs={a.pk}&metric=loss&points=30&x=time").json()
    xs = [bk["x"] for bk in by_time["series"][str(a.pk)]]
    assert xs[0] == pytest.approx(0.1) and xs[-1] <= 30.0 and xs == sorted(xs)


def test_refusals(three: list[Job], viewer: User) -> None:
    a = three[0]
    assert api(None).get(f"/api/v1/compare/?jobs={a.pk}").status_code in (401, 403)
    missing = api(viewer).get(f"/api/v1/compare/?jobs={a.pk},999999")
    assert missing.status_code == 404 and "999999" in missing.json()["detail"]
    both = api(viewer).get(f"/api/v1/compare/?jobs={a.pk}&name=cmp")
    assert both.status_code == 400 and "one of jobs, name or sweep" in both.json()["errors"]["jobs"][0]
    assert api(viewer).get("/api/v1/compare/?jobs=1;DROP").status_code == 400


def test_export_csv_and_parquet(three: list[Job], viewer: User) -> None:
    a = three[0]
    response = api(viewer).get(f"/api/v1/jobs/{a.pk}/metrics/export/?format=csv&name=accuracy")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert [(r["step"], r["value"]) for r in rows] == [("100", "0.5"), ("300", "0.9")]
    parquet = api(viewer).get(f"/api/v1/jobs/{a.pk}/metrics/export/?format=parquet")
    assert parquet.status_code == 200
    table = pq.read_table(io.BytesIO(b"".join(parquet.streaming_content)))  # type: ignore[attr-defined]
    assert table.num_rows == 302 and table.column_names == ["round", "rank", "step", "name", "value", "time"]
    assert api(viewer).get("/api/v1/jobs/999999/metrics/export/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_cli_compare_prints_the_table(console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cmp-cli", password="pw-cmp-cli-1")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    a = make_job("cli-a", 0.1, 64, {10: 3.0, 20: 1.0}, {20: 0.7})
    b = make_job("cli-b", 0.2, 64, {10: 2.0, 20: 1.5}, {20: 0.6})
    env = {
        **os.environ,
        "TRAINYARD_CONFIG": str(tmp_path / "config.json"),
        "TRAINYARD_PASSWORD": "pw-cmp-cli-1",
    }
    env.pop("TRAINYARD_URL", None)
    env.pop("TRAINYARD_TOKEN", None)
    cli = str(Path(sys.executable).parent / "trainyard")
    login = subprocess.run(
        [cli, "login", "--url", console_url, "--username", "cmp-cli"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    shown = subprocess.run(
        [cli, "compare", str(a.pk), str(b.pk)], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "lr" in shown.stdout and "0.1" in shown.stdout and "0.2" in shown.stdout
    assert "loss (min)" in shown.stdout and "1 (best 1 @ 20)" in shown.stdout
    as_json = subprocess.run(
        [cli, "compare", "--name", "cli-", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(as_json.stdout)["hyperparameters"] == {"lr": {str(a.pk): 0.1, str(b.pk): 0.2}}
    missing = subprocess.run([cli, "compare", "999999"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 3 and "999999" in missing.stderr


def test_tracker_links_only_for_http_urls(three: list[Job], viewer: User) -> None:
    """The tracker events come from the job's own process: a hostile one must not plant a link."""
    from console.telemetry.models import Event

    job = three[0]
    data = {"experiment_id": "4", "run_id": "abc", "rank": 0}
    Event.objects.create(
        job=job, kind="tracker.mlflow", message="m", data={**data, "tracking_uri": "javascript:alert(1)//"}
    )
    Event.objects.create(
        job=job,
        kind="tracker.mlflow",
        message="m",
        data={**data, "run_id": "def", "tracking_uri": "https://mlflow.example"},
    )
    Event.objects.create(
        job=job,
        kind="tracker.tensorboard",
        message="t",
        data={"logdir": "/ckpt/tb/round-1/rank-0", "host": "h1", "rank": 0},
    )
    client = APIClient()
    client.force_login(viewer)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'href="https://mlflow.example/#/experiments/4/runs/def"' in html
    assert "javascript:" not in html.split('id="tracker-list"')[1].split("</ul>")[0].replace(
        "run abc at javascript:alert(1)//", ""
    )
    assert 'href="javascript' not in html
    assert "tensorboard --logdir /ckpt/tb/round-1/rank-0" in html
    assert f"/api/v1/jobs/{job.pk}/metrics/export/?format=parquet" in html
