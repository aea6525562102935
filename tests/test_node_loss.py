"""Node loss. In-process: a node that misses its heartbeats is LOST; its jobs get a node-loss
round on the survivors, refilled from free nodes (killed at once everywhere, no restart used), or
go back to PENDING with their progress when too few nodes remain, and resume when a node comes.
End to end: a host SIGKILLed with its ranks is LOST within a few heartbeats, and the job goes on
at the smaller world from its checkpoint and ends SUCCEEDED."""

from __future__ import annotations

import contextlib
import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from console.cluster.models import Node
from console.core.states import JobState, NodeState, RoundReason
from console.jobs import scheduler
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints
from tests.support.controller import wait_for
from tests.support.decisions import Decide, make_job, make_node, nodes_of, start, stop

STEPS = 120


def lose(name: str) -> None:
    Node.objects.filter(name=name).update(last_heartbeat=timezone.now() - timedelta(minutes=5))


def test_a_lost_node_is_replaced_by_a_free_one_in_a_round_that_kills_the_old_one(decide: Decide) -> None:
    # Given a 2:3 job on a, b, c (one slot each) and a free node d that joined later
    for name in "abc":
        make_node(name, slots=1)
    job = make_job("elastic", nnodes="2:3")
    decide(scheduler.tick)
    make_node("d", slots=1)

    # When c misses its heartbeats
    lose("c")
    lost = decide(scheduler.tick)

    # Then c is LOST, and round 2 runs on a, b (ranks kept) and d, the old round killed everywhere
    assert Node.objects.get(name="c").state == NodeState.LOST
    assert lost.sent() == [
        stop(job, 1, "a", 0.0),
        stop(job, 1, "b", 0.0),
        stop(job, 1, "c", 0.0),
        start(job, 2, "a", 0, 3),
        start(job, 2, "b", 1, 3),
        start(job, 2, "d", 2, 3),
    ]
    assert lost.kinds() == ["node.lost", "job.node_lost", "round.node_loss"]
    assert lost.events[1].message == "Node c was lost; continuing on 3 node(s)"
    job.refresh_from_db()
    assert nodes_of(job) == ["a", "b", "d"] and job.restarts == 0
    assert job.current_round().reason == RoundReason.NODE_LOSS  # type: ignore[union-attr]


def test_too_few_nodes_left_send_the_job_back_to_pending_then_it_resumes(decide: Decide) -> None:
    make_node("a"), make_node("b")
    job = make_job("pair", nnodes="2")
    decide(scheduler.tick)
    job.progress = {"step": 42}
    job.save(update_fields=["progress"])

    lose("b")
    requeued = decide(scheduler.tick)

    assert requeued.to_agents() == [stop(job, 1, "a", 12.0), stop(job, 1, "b", 12.0)]
    assert requeued.kinds() == ["node.lost", "job.pending"]
    assert requeued.events[1].message == "Node b was lost; 1 node(s) left, 2 needed"
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.progress == {"step": 42} and job.restarts == 0

    # When another node comes, the job resumes there with a that it kept
    make_node("c")
    resumed = decide(scheduler.tick)
    assert resumed.to_agents() == [start(job, 2, "a", 0, 2), start(job, 2, "c", 1, 2)]
    assert resumed.kinds() == ["round.resume"]
    assert nodes_of(job) == ["a", "c"]


def kill_host(cluster: Cluster, name: str) -> None:
    ranks = cluster.rank_pids(name)
    cluster.agent(name).kill()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.cluster
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
