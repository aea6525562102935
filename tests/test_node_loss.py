"""Given a 3-node elastic job, when one host dies (agent and ranks SIGKILLed), then within a few
heartbeats the node is LOST, the job goes on at the smaller world from its checkpoint without
using up a restart, and it ends SUCCEEDED. A job with too few nodes left goes back to PENDING
with its progress and resumes when a node returns."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from console.cluster.models import Node
from console.core.states import JobState, NodeState
from console.jobs.models import RoundReason
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints
from tests.support.controller import wait_for

pytestmark = pytest.mark.cluster

STEPS = 120


def kill_host(cluster: Cluster, name: str) -> None:
    ranks = cluster.rank_pids(name)
    cluster.agent(name).kill()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_lost_node_shrinks_the_job_without_using_a_restart(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b", "node-c")
    job = cluster.submit_ddp(nnodes="2:3", steps=STEPS)
    cluster.wait_steps(job, world=3, count=12)
    kill_host(cluster, "node-c")

    wait_for(
        lambda: Node.objects.get(name="node-c").state == NodeState.LOST, timeout=30, message="node-c LOST"
    )
    cluster.wait_steps(job, world=2, count=3)
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0, cluster.diagnose(job)
    last = job.rounds.order_by("-number").first()
    assert last is not None and last.world_size == 2
    assert job.rounds.filter(reason=RoundReason.NODE_LOSS).exists()
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=STEPS)


def test_too_few_nodes_left_sends_the_job_back_to_pending_then_it_resumes(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b")
    job = cluster.submit_ddp(nnodes="2", steps=60)
    cluster.wait_steps(job, world=2, count=12)
    kill_host(cluster, "node-b")
    job = cluster.wait_state(job, JobState.PENDING, timeout=30)
    # The survivor's ranks are stopped while the job waits; the checkpoint keeps its progress.
    wait_for(lambda: not cluster.rank_pids("node-a"), timeout=30, message="node-a's ranks to stop")
    cluster.start_agents("node-d")
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=60)
