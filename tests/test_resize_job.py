"""Given a running DDP job on real agents, when an operator resizes it 3 → 2 → 3 → 1 through
the API, then every resize is a new round at the new world size that resumes from the
checkpoint, keeps node rank 0 where it was, costs no restart, and the job ends SUCCEEDED."""

from __future__ import annotations

from typing import Any

import pytest

from console.core.states import JobState
from console.jobs.models import RoundReason
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints

pytestmark = pytest.mark.cluster

STEPS = 200


def resize(cluster: Cluster, job_id: int, nodes: int) -> dict[str, Any]:
    response = cluster.api.post(f"/api/v1/jobs/{job_id}/resize/", {"nodes": nodes}, format="json")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    assert body["world_size"] == nodes and len(body["nodes"]) == nodes
    return body


def test_resize_while_training(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b", "node-c")
    job = cluster.submit_ddp(nnodes="1:3", steps=STEPS)
    cluster.wait_steps(job, world=3)
    first = cluster.api.get(f"/api/v1/jobs/{job.pk}/").json()["nodes"]

    after_two = resize(cluster, job.pk, 2)
    assert after_two["nodes"] == first[:2]  # the highest node rank leaves; rank 0 stays
    cluster.wait_steps(job, world=2)
    resize(cluster, job.pk, 3)
    cluster.wait_steps(job, world=3, count=6)
    assert resize(cluster, job.pk, 1)["nodes"] == first[:1]
    cluster.wait_steps(job, world=1)

    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0
    rounds = list(job.rounds.order_by("number").values_list("reason", "world_size"))
    assert rounds == [
        (RoundReason.START, 3),
        (RoundReason.RESIZE, 2),
        (RoundReason.RESIZE, 3),
        (RoundReason.RESIZE, 1),
    ]
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=STEPS)
    worlds = [r["world"] for r in cluster.progress(job) if "step" in r]
    assert worlds[0] == 3 and 2 in worlds and worlds[-1] == 1
