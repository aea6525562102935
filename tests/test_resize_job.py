"""Resizing a job. In-process: an operator's resize 3 → 2 → 3 stops only the node that leaves,
starts the new round on every member with node rank 0 in place, and costs no restart; a pending
job only changes its target. End to end on real agents: a resize while training is a new round
at the new world size that resumes from the checkpoint, and the job ends SUCCEEDED."""

from __future__ import annotations

from typing import Any

import pytest

from console.core.models import AuditEntry
from console.core.states import JobState, RoundReason
from console.jobs import actions, scheduler
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints
from tests.support.decisions import TICK, Decide, make_job, make_node, nodes_of, start, stop


def test_resize_sends_the_new_round_to_its_members_and_stops_the_node_that_leaves(decide: Decide) -> None:
    # Given a 1:3 job running on a, b and c
    for name in "abc":
        make_node(name)
    job = make_job("elastic", nnodes="1:3")
    decide(scheduler.tick)

    # When the operator resizes it to 2
    shrunk = decide(actions.resize_job, job.pk, 2, None)

    # Then c's ranks stop gracefully and a, b start round 2 in the same node-rank order
    assert shrunk.sent() == [stop(job, 1, "c", 12.0), start(job, 2, "a", 0, 2), start(job, 2, "b", 1, 2)]
    assert shrunk.kinds() == ["job.resize_requested", "round.resize"]
    assert shrunk.events[0].data == {"nodes": 2}
    assert shrunk.events[1].data == {"nodes": ["a", "b"], "world_size": 2, "charged": False}
    assert AuditEntry.objects.filter(action="job.resize", data={"nodes": 2, "previous": 3}).count() == 1

    # When it is resized back to 3, nothing stops: agents replace the old round on start
    grown = decide(actions.resize_job, job.pk, 3, None)
    assert grown.sent() == [start(job, 3, "a", 0, 3), start(job, 3, "b", 1, 3), start(job, 3, "c", 2, 3)]
    job.refresh_from_db()
    assert (job.state, job.restarts, job.round_number) == (JobState.RESIZING, 0, 3)
    assert list(job.rounds.values_list("reason", "state", "outcome")) == [
        ("start", "ended", "replaced"),
        ("resize", "ended", "replaced"),
        ("resize", "starting", None),
    ]


def test_resizing_a_pending_job_only_changes_its_target(decide: Decide) -> None:
    job = make_job("waiting", nnodes="1:3")
    resized = decide(actions.resize_job, job.pk, 1, None)
    assert resized.sent() == [TICK]
    assert resized.kinds() == ["job.resize_requested"]
    assert nodes_of(job) == [] and job.desired_nodes == 1


def test_a_resize_outside_the_range_is_refused_and_sends_nothing(decide: Decide) -> None:
    make_node("a")
    job = make_job("fixed", nnodes="1")
    decide(scheduler.tick)
    with pytest.raises(actions.InvalidRequest, match=r"outside 1\.\.1"):
        decide(actions.resize_job, job.pk, 2, None)
    assert decide.recorder.sent == []


STEPS = 200


def resize(cluster: Cluster, job_id: int, nodes: int) -> dict[str, Any]:
    response = cluster.api.post(f"/api/v1/jobs/{job_id}/resize/", {"nodes": nodes}, format="json")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    assert body["world_size"] == nodes and len(body["nodes"]) == nodes
    return body


@pytest.mark.cluster
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

    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0
    rounds = list(job.rounds.order_by("number").values_list("reason", "world_size"))
    assert rounds == [(RoundReason.START, 3), (RoundReason.RESIZE, 2), (RoundReason.RESIZE, 3)]
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=STEPS)
    worlds = [r["world"] for r in cluster.progress(job) if "step" in r]
    assert worlds[0] == 3 and 2 in worlds and worlds[-1] == 3
