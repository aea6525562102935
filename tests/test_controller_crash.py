"""Given a running job, when the controller is SIGKILLed mid-run and started again, then
training goes on untouched while it is down, the new controller picks up where the old one
left off (no lost, duplicated or double-started round), and the job ends SUCCEEDED."""

from __future__ import annotations

import pytest

from console.core.states import JobState
from console.jobs.models import Allocation
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints
from tests.support.controller import wait_for

pytestmark = pytest.mark.cluster

STEPS = 120


def test_controller_sigkill_mid_run_loses_nothing(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b")
    job = cluster.submit_ddp(nnodes="1:2", steps=STEPS)
    first = cluster.wait_steps(job, world=2, count=10)
    cluster.controller.kill()
    assert not cluster.controller.alive()
    before = len([r for r in cluster.progress(job) if "step" in r])
    # (ten more steps, not a fixed wait: the job's own log says training goes on)
    wait_for(
        lambda: len([r for r in cluster.progress(job) if "step" in r]) >= before + 10,
        timeout=60,
        message="training to go on while the controller is down",
    )
    assert not cluster.controller.alive()

    # An operator acts while the controller is down: the resize is stored and carried out.
    response = cluster.api.post(f"/api/v1/jobs/{job.pk}/resize/", {"nodes": 1}, format="json")
    assert response.status_code == 200, response.content
    cluster.controller.start()
    cluster.wait_steps(job, world=1, count=3)

    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0
    assert list(job.rounds.order_by("number").values_list("number", flat=True)) == [1, 2]
    assert Allocation.objects.filter(round__job=job).count() == 3  # 2 nodes, then 1
    records = cluster.progress(job)
    assert sum(1 for r in records if r.get("event") == "start") == 2, "no round may start twice"
    assert_resumes_from_checkpoints(records, every=5, total=STEPS)
    assert first["world"] == 2
