"""Given a node running jobs, when an operator drains it, then it takes no new work, the next tick
moves elastic jobs off it (a drain round on the other members, its own ranks stopped gracefully,
no restart used) and marks it DRAINED once nothing runs there; a job that cannot shrink keeps it
DRAINING until it ends."""

from __future__ import annotations

from console.cluster.actions import drain_node
from console.cluster.models import Node
from console.core.states import JobState, NodeState, RoundReason
from console.jobs import actions, scheduler
from tests.support.decisions import TICK, Decide, make_job, make_node, nodes_of, start, stop


def test_draining_moves_an_elastic_job_off_the_node_then_it_is_drained(decide: Decide) -> None:
    make_node("a")
    b = make_node("b")
    job = make_job("elastic", nnodes="1:2")
    decide(scheduler.tick)

    drained = decide(drain_node, b.pk, None)
    assert drained.sent() == [TICK]
    assert drained.kinds() == ["node.draining"]

    moved = decide(scheduler.tick)
    assert moved.sent() == [stop(job, 1, "b", 12.0), start(job, 2, "a", 0, 1)]
    assert moved.kinds() == ["job.drained_off", "round.drain", "node.drained"]
    assert moved.events[0].message == "Moving off draining node b"
    assert Node.objects.get(pk=b.pk).state == NodeState.DRAINED
    job.refresh_from_db()
    assert nodes_of(job) == ["a"] and job.restarts == 0
    assert job.current_round().reason == RoundReason.DRAIN  # type: ignore[union-attr]


def test_a_job_that_cannot_shrink_keeps_the_node_draining_until_it_ends(decide: Decide) -> None:
    make_node("a")
    b = make_node("b")
    job = make_job("pair", nnodes="2")
    decide(scheduler.tick)
    drain_node(b.pk, None)

    waiting = decide(scheduler.tick)
    assert waiting.sent() == [] and waiting.kinds() == []
    assert Node.objects.get(pk=b.pk).state == NodeState.DRAINING

    decide(actions.stop_job, job.pk, None)
    done = decide(scheduler.tick)
    assert done.kinds() == ["node.drained"]
    assert Node.objects.get(pk=b.pk).state == NodeState.DRAINED
    assert Node.objects.get(name="a").state == NodeState.ONLINE
    job.refresh_from_db()
    assert job.state == JobState.STOPPED
