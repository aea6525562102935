"""Given an elastic job running on fewer nodes than its maximum, when more agents come up,
then the controller grows it toward MAX in a new round (no restart used)."""

from __future__ import annotations

import pytest

from console.core.states import JobState
from console.jobs.models import RoundReason
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints

pytestmark = pytest.mark.cluster


def test_elastic_job_grows_when_capacity_frees_up(cluster: Cluster) -> None:
    cluster.start_agents("node-a")
    job = cluster.submit_ddp(nnodes="1:2", steps=300)
    cluster.wait_steps(job, world=1, count=8)
    cluster.start_agents("node-b")
    cluster.wait_steps(job, world=2, count=3)
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert list(job.rounds.order_by("number").values_list("reason", flat=True)) == [
        RoundReason.START,
        RoundReason.AUTOSCALE,
    ]
    assert job.restarts == 0
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=300)
