"""Charts for plain scripts, and sdk.log mirrored to TensorBoard, with real agents, a controller
and ingest:

- a plain DDP script that writes TensorBoard scalars with ``SummaryWriter()`` (``runs/`` under its
  working directory) and imports nothing of Trainyard gets every scalar stored as a metric (the
  agent reads the event files), its progress from their steps, and a job page with charts;
- a script using the SDK with ``TRAINYARD_TRACKERS=tensorboard`` leaves event files that
  TensorBoard's own reader reads back with exactly the points the console stored, which the agent
  does not ship a second time; the job page names where they are.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from console.core.states import JobState
from console.jobs.models import Job
from console.telemetry.models import Event, Metric
from tests.support.controller import wait_for
from tests.support.live import LiveConsole

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]
SCRIPTS = Path(__file__).parent / "scripts"


def operator_api() -> APIClient:
    user = User.objects.create_user("tb-operator", password="pw-tb-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(user)
    return api


def submit(api: APIClient, body: dict[str, object]) -> Job:
    response = api.post("/api/v1/jobs/", {"nnodes": "1", "grace_period": 5, **body}, format="json")
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def finished(job: Job, timeout: float = 180) -> Job:
    def done() -> Job | None:
        job.refresh_from_db()
        return job if job.job_state.is_terminal else None

    result: Job = wait_for(done, timeout=timeout, message=f"job {job.pk} to end")
    return result


def test_plain_script_scalars_and_sdk_mirror(live_console: LiveConsole, tmp_path: Path) -> None:
    live_console.start_agents("tb-a")
    api = operator_api()
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPTS / "tb_ddp.py", code / "tb_ddp.py")
    plain = submit(
        api,
        {
            "name": "tb-plain",
            "entrypoint": "tb_ddp.py",
            "workdir": str(code),
            "args": ["--steps", "40"],
            "nproc_per_node": 2,
        },
    )
    assert finished(plain).state == JobState.SUCCEEDED, live_console.root

    # Every scalar rank 0 wrote, once: 40 steps of loss, and add_scalars' lr/base.
    def stored() -> list[int] | None:
        steps = list(
            Metric.objects.filter(job=plain, name="loss").order_by("step").values_list("step", flat=True)
        )
        return steps if len(steps) == 40 else None

    assert wait_for(stored, timeout=60, message="40 loss points") == list(range(40))
    assert Metric.objects.filter(job=plain, name="lr/base").count() == 40
    # (the agent's own resource samples, res_*, come from every rank)
    shipped = Metric.objects.filter(job=plain).exclude(name__startswith="res_")
    assert set(shipped.values_list("rank", flat=True)) == {0}

    # Progress from their steps (the heartbeats' last step), the page charts them.
    def progress_step() -> bool:
        plain.refresh_from_db()
        return plain.progress.get("step") == 39

    wait_for(progress_step, timeout=60, message="progress 39")
    page = APIClient()
    page.force_login(User.objects.get(username="tb-operator"))
    html = page.get(f"/jobs/{plain.pk}/").content.decode()
    assert "No metrics reported yet" not in html and '"loss"' in html

    mirrored = submit(
        api,
        {
            "name": "tb-sdk",
            "entrypoint": str(SCRIPTS / "sdk_job" / "train.py"),
            "args": ["--steps", "15", "--sleep", "0.05"],
            "nproc_per_node": 1,
            "env": {"TRAINYARD_TRACKERS": "tensorboard"},
        },
    )
    assert finished(mirrored).state == JobState.SUCCEEDED

    def announced() -> Event | None:
        return Event.objects.filter(job=mirrored, kind="tracker.tensorboard").first()

    event: Event = wait_for(announced, timeout=60, message="the tracker.tensorboard event")
    logdir = Path(event.data["logdir"])
    assert logdir.name == "rank-0" and logdir.parent.name == "round-1"
    files = list(logdir.glob("events.out.tfevents.*.trainyard-sdk"))
    assert len(files) == 1

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(logdir))
    reader.Reload()
    from_files = [(s.step, s.value) for s in reader.Scalars("loss")]

    def all_stored() -> list[tuple[int, float]] | None:
        rows = list(
            Metric.objects.filter(job=mirrored, name="loss").order_by("step").values_list("step", "value")
        )
        return rows if len(rows) >= len(from_files) else None

    rows = wait_for(all_stored, timeout=60, message="the SDK's loss points")
    assert len(from_files) == 15 and [s for s, _ in from_files] == [s for s, _ in rows]
    assert [v for _, v in from_files] == pytest.approx([v for _, v in rows], rel=1e-6)
    # The agent left the SDK's own event files alone: no second copy under TensorBoard's sequence numbers.
    assert not Metric.objects.filter(job=mirrored, seq__gte=1 << 40).exists()
    html = page.get(f"/jobs/{mirrored.pk}/").content.decode()
    assert "TensorBoard" in html and f"tensorboard --logdir {logdir}" in html
