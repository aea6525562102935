"""Given a running DDP job on real agents, when an operator resizes it 2 → 3 → 1 through the
API, then every resize is a new round at the new world size that resumes from the checkpoint,
costs no restart, and the job still ends SUCCEEDED."""

from __future__ import annotations

import pytest

from console.core.states import JobState
from console.jobs.models import RoundReason
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints

pytestmark = pytest.mark.cluster

STEPS = 150


def test_resize_two_three_one_while_training(cluster: Cluster) -> None:
    job = cluster.submit_ddp(nnodes="1:3", steps=STEPS)
    # Resizing a pending job sets the node count it will start with.
    assert cluster.api.post(f"/api/v1/jobs/{job.pk}/resize/", {"nodes": 2}, format="json").status_code == 200
    cluster.start_agents("node-a", "node-b", "node-c")

    cluster.wait_steps(job, world=2)
    response = cluster.api.post(f"/api/v1/jobs/{job.pk}/resize/", {"nodes": 3}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["world_size"] == 3
    cluster.wait_steps(job, world=3)

    response = cluster.api.post(f"/api/v1/jobs/{job.pk}/resize/", {"nodes": 1}, format="json")
    assert response.status_code == 200
    assert response.json()["nodes"] == ["node-a"]  # node rank 0 stays put
    cluster.wait_steps(job, world=1)

    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0
    reasons = list(job.rounds.order_by("number").values_list("reason", "world_size"))
    assert reasons == [(RoundReason.START, 2), (RoundReason.RESIZE, 3), (RoundReason.RESIZE, 1)]
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=STEPS)
    worlds = [r["world"] for r in cluster.progress(job) if "step" in r]
    assert worlds[0] == 2 and 3 in worlds and worlds[-1] == 1
